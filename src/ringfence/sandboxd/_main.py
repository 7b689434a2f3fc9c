"""Command line: ``--listen-fd N [--user NAME] [--root]``; then serve until killed."""

from __future__ import annotations

import os
import sys

from . import _users
from ._server import Server
from .methods import ROOT_USER, SANDBOX_USER

__all__ = ["main"]

_USAGE = "usage: sandboxd --listen-fd N [--user NAME] [--root]\n"


def _parse(argv: list[str]) -> tuple[int, str, bool] | None:
    fd: int | None = None
    user = SANDBOX_USER
    root = False
    args = iter(argv)
    for arg in args:
        if arg == "--root":
            root = True
            continue
        name, eq, value = arg.partition("=")
        if not eq:
            value = next(args, "")
        if name == "--listen-fd" and value.isdigit():
            fd = int(value)
        elif name == "--user" and value:
            user = value
        else:
            return None
    return None if fd is None or user == ROOT_USER else (fd, user, root)


def _close_on_exec_all() -> None:
    """Whatever fd the host let us inherit must not reach the processes we start."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in fds:
        fd = int(name)
        if fd > 2:
            try:  # noqa: SIM105 - contextlib costs memory
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the fd listdir itself used, now closed


def _make_undumpable() -> bool:
    """PR_SET_DUMPABLE 0: the commands we start run as our uid, and for a dumpable process
    that would let them open our /proc files (fd, mem, environ) and take our descriptors
    (the listening socket, live connections) with pidfd_getfd. The kernel resets it for
    every program we exec, so what we start is unaffected. Through ``_ctypes`` alone: the
    ``ctypes`` package costs a third of a megabyte per sandbox. Returns whether it holds."""
    try:
        import _ctypes
    except ImportError:
        return False
    # None: the process's own symbols (libc's, whichever libc the template has)
    prctl = _ctypes.dlsym(_ctypes.dlopen(None, 2), "prctl")  # type: ignore[arg-type]
    set_dumpable, get_dumpable = 4, 3
    call = getattr(_ctypes, "call_function", None)
    if call is None:  # a Python without the private helper: the public, heavier way
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(set_dumpable, 0, 0, 0, 0)
        return bool(libc.prctl(get_dumpable, 0, 0, 0, 0) == 0)
    call(prctl, (set_dumpable, 0, 0, 0, 0))
    return bool(call(prctl, (get_dumpable, 0, 0, 0, 0)) == 0)


def _give_home_to(user: str) -> None:
    """The home directory (a fresh tmpfs bwrap made as ns root, or a volume's) belongs to
    the sandbox user, who works in it; what is inside keeps its owners."""
    home = os.environ.get("HOME") or "/home/user"
    try:
        if os.stat(home).st_uid == 0:
            os.chown(home, _users.USER_ID, _users.USER_ID)
    except OSError as exc:
        sys.stderr.write(f"sandboxd: cannot give {home} to {user}: {exc}\n")


def _restore_signals() -> None:
    """Signals the daemon inherited ignored go back to their defaults, for it and every
    command it starts: an ignored disposition survives fork and exec, so a server started
    with ``nohup`` or as a background job of a shell (SIGHUP, SIGINT, SIGQUIT ignored) gave
    every sandbox command signals it could neither receive nor ``trap`` (a shell cannot
    trap what was ignored when it started), and ^C in a terminal did nothing. SIGPIPE and
    SIGXFSZ are Python's own and reset per command; SIGINT gets Python's handler back."""
    import _signal  # type: ignore[import-not-found]  # signal itself imports enum

    for signum in range(1, 32):
        if signum in (9, 13, 19, 25):  # KILL, PIPE, STOP, XFSZ
            continue
        try:
            if _signal.getsignal(signum) != _signal.SIG_IGN:
                continue
            default = _signal.default_int_handler if signum == 2 else _signal.SIG_DFL
            _signal.signal(signum, default)
        except (OSError, ValueError):
            continue


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if parsed is None:
        sys.stderr.write(_USAGE)
        return 2
    _restore_signals()
    fd, user, root = parsed
    if root:
        why = _users.enable_root()
        if why is not None:  # fail closed: never serve root in a way that could not act
            sys.stderr.write(f"sandboxd: {why}\n")
            return 2
        _give_home_to(user)
        # apt's download user (_apt) is not mapped here: apt keeps root (see apt.conf).
        os.environ.setdefault("APT_CONFIG", os.path.join(os.path.dirname(__file__), "apt.conf"))
    if not _make_undumpable():  # fail closed: never serve with our descriptors in reach
        sys.stderr.write("sandboxd: cannot make the daemon non-dumpable (prctl)\n")
        return 2
    _close_on_exec_all()
    from _socket import socket

    try:
        listener = socket(fileno=fd)
    except OSError as exc:
        sys.stderr.write(f"sandboxd: --listen-fd {fd} is not a socket: {exc}\n")
        return 2
    listener.setblocking(True)
    if root:
        from . import _sudo

        _sudo.serve()
    try:
        Server(listener, user, _users.available()).serve_forever()
    except KeyboardInterrupt:
        return 0
    return 1
