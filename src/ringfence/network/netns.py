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
from pathlib import Path

__all__ = ["ListenSpec", "listen_in_netns", "no_route_counts", "open_netns"]

_CLONE_NEWNET = 0x40000000
_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ListenSpec:
    kind: socket.SocketKind  # SOCK_STREAM or SOCK_DGRAM
    port: int
    host: str = "127.0.0.1"


def open_netns(pid: int) -> int:
    """A descriptor of the network namespace of ``pid`` (close it when done).

    Raises:
        OSError: no such process, or not allowed.
    """
    return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def _enter(netns: int) -> None:
    if _libc.setns(netns, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns into the sandbox's network: {os.strerror(errno)}")


def no_route_counts(netns: int) -> dict[str, int]:
    """How many packets the namespace's kernel refused for want of a route, IPv4 and IPv6:
    every direct connection or datagram a sandbox tried counts there (there is no route).

    Raises:
        OSError: the namespace cannot be entered.
    """
    found: dict[str, int] = {}
    failure: list[OSError] = []

    def enter_and_read() -> None:
        try:
            _enter(netns)
            snmp = Path("/proc/thread-self/net/snmp").read_text().splitlines()
            ip_names, ip_values = snmp[0].split(), snmp[1].split()
            found["ipv4"] = int(dict(zip(ip_names, ip_values, strict=True))["OutNoRoutes"])
            for line in Path("/proc/thread-self/net/snmp6").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "Ip6OutNoRoutes":
                    found["ipv6"] = int(value.strip())
        except (OSError, KeyError, IndexError, ValueError) as exc:
            failure.append(exc if isinstance(exc, OSError) else OSError(str(exc)))

    thread = threading.Thread(target=enter_and_read, name="netns-counters")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return found


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
            fd = open_netns(pid)
            try:
                _enter(fd)
            finally:
                os.close(fd)
            for spec in specs:
                sock = socket.socket(socket.AF_INET, spec.kind)
                made.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                # bubblewrap brings the loopback up from inside only after it reported the
                # pid: bind before the address exists; it serves once it does (before the
                # command is released, which bubblewrap does after its loopback setup).
                sock.setsockopt(socket.IPPROTO_IP, _IP_FREEBIND, 1)
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
