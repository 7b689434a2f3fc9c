"""Listening sockets made inside a sandbox's network namespace, from the host.

A socket belongs to the network namespace it was created in, whoever later uses it. A
short-lived thread enters the sandbox's namespace (``setns``), creates and binds the
sockets on the sandbox's loopback, and ends; the event loop then serves them. Nothing runs
inside the sandbox and nothing is added to its namespace but these listeners: no
interface, no route, no firewall rule. Needs CAP_SYS_ADMIN over the namespace (root).
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from dataclasses import dataclass

__all__ = ["ListenSpec", "listen_in_netns"]

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ListenSpec:
    kind: socket.SocketKind  # SOCK_STREAM or SOCK_DGRAM
    port: int
    host: str = "127.0.0.1"


def listen_in_netns(pid: int, specs: list[ListenSpec]) -> list[socket.socket]:
    """Sockets bound (and listening, for TCP) in the network namespace of ``pid``.

    Raises:
        OSError: the namespace cannot be entered (not root, the process is gone) or a
            socket cannot be bound.
    """
    made: list[socket.socket] = []
    failure: list[OSError] = []

    def enter_and_bind() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns into the sandbox's network: {os.strerror(errno)}")
            finally:
                os.close(fd)
            for spec in specs:
                sock = socket.socket(socket.AF_INET, spec.kind)
                made.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((spec.host, spec.port))
                if spec.kind == socket.SOCK_STREAM:
                    sock.listen(128)
                sock.setblocking(False)
        except OSError as exc:
            failure.append(exc)

    # The thread's namespace dies with it: the server's own threads never leave the host's.
    thread = threading.Thread(target=enter_and_bind, name=f"netns-{pid}")
    thread.start()
    thread.join()
    if failure:
        for sock in made:
            sock.close()
        raise failure[0]
    return made
