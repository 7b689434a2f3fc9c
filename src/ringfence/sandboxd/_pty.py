"""Terminals: a process on a pseudo-terminal (E2B envd's ``pty`` processes).

A terminal is a pty pair from the sandbox's own ``/dev/ptmx`` (bwrap's ``--dev`` gives each
sandbox a private devpts instance). The process is the session leader of a new session with
the pty's slave as its controlling terminal and as its stdin, stdout and stderr; the daemon
keeps the master: it reads the terminal's output (one ``pty`` stream, no stdout/stderr
split), writes the caller's input into it and sets its size (the kernel sends ``SIGWINCH``
to the foreground job). Input is only bytes the line discipline hands to the process in the
sandbox: nothing the daemon interprets (``TIOCSTI``, pushing input into a terminal, is
refused by the sandbox's seccomp filter anyway).

An interactive shell puts each job in its own process group, so killing a terminal kills
its whole session (every process whose session id is the shell's pid), not only the shell's
group. At most ``LIMIT`` terminals run at once in a sandbox.

Loaded on the first terminal: ``fcntl`` and ``termios`` are small C modules.
"""

from __future__ import annotations

import _struct  # struct itself is a Python wrapper
import fcntl
import os
import termios

from ._errors import RpcError, invalid

__all__ = ["LIMIT", "MAX_SIDE", "control", "kill_session", "open_terminal", "resize", "size_of"]

LIMIT = 32  # terminals running at once in one sandbox
MAX_SIDE = 65535  # struct winsize holds unsigned shorts


def size_of(pty: dict[str, object]) -> tuple[int, int]:
    """``(rows, cols)`` of a ``PTY`` message (``{"size": {"rows": r, "cols": c}}``).

    Raises:
        RpcError: invalid_argument for a missing, zero or too large side.
    """
    size = pty.get("size")
    if not isinstance(size, dict):
        raise invalid("pty.size is required: {rows, cols}")
    sides = []
    for name in ("rows", "cols"):
        value = size.get(name, 0)
        if isinstance(value, str) and value.isdigit() and len(value) < 12:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SIDE:
            raise invalid(f"pty.size.{name} must be an integer from 1 to {MAX_SIDE}")
        sides.append(value)
    return sides[0], sides[1]


def open_terminal(rows: int, cols: int) -> tuple[int, int]:
    """A new pty pair ``(master, slave)`` of this size; the master is non-blocking (a
    writer never hangs on a process that does not read) and both are close-on-exec.

    Raises:
        RpcError: resource_exhausted when the sandbox has no pty left to give.
    """
    try:
        master, slave = os.openpty()
    except OSError as exc:
        raise RpcError("resource_exhausted", f"cannot open a terminal: {exc.strerror}") from None
    resize(master, rows, cols)
    os.set_blocking(master, False)
    return master, slave


def resize(fd: int, rows: int, cols: int) -> None:
    """Set the terminal's size (on the master: the kernel signals the foreground job)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, _struct.pack("HHHH", rows, cols, 0, 0))


def control(slave: int) -> None:
    """In the forked child, after ``setsid``: make ``slave`` the controlling terminal and
    fds 0, 1 and 2. Raises OSError when the kernel refuses (the exec must not run)."""
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    if slave > 2:
        os.close(slave)


def kill_session(sid: int, signum: int) -> None:
    """Send ``signum`` to every process of session ``sid`` (the sandbox's /proc lists only
    its own processes). A process that started a session of its own is not reached."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue  # gone meanwhile
        # After the command's name: state, ppid, pgrp, session, ...
        if len(fields) > 3 and fields[3] == b"%d" % sid:
            try:  # noqa: SIM105 - contextlib costs memory
                os.kill(int(name), signum)
            except OSError:
                pass  # gone meanwhile
