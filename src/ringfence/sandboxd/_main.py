"""Command line: ``--listen-fd N [--user NAME]``; then serve until killed."""

from __future__ import annotations

import os
import sys

from ._server import Server

__all__ = ["main"]

_USAGE = "usage: sandboxd --listen-fd N [--user NAME]\n"


def _parse(argv: list[str]) -> tuple[int, str] | None:
    fd: int | None = None
    user = "user"
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if not eq:
            value = next(args, "")
        if name == "--listen-fd" and value.isdigit():
            fd = int(value)
        elif name == "--user" and value:
            user = value
        else:
            return None
    return None if fd is None else (fd, user)


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


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if parsed is None:
        sys.stderr.write(_USAGE)
        return 2
    fd, user = parsed
    _close_on_exec_all()
    from _socket import socket

    try:
        listener = socket(fileno=fd)
    except OSError as exc:
        sys.stderr.write(f"sandboxd: --listen-fd {fd} is not a socket: {exc}\n")
        return 2
    listener.setblocking(True)
    try:
        Server(listener, user).serve_forever()
    except KeyboardInterrupt:
        return 0
    return 1
