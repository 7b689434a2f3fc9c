"""``GET /ports/{port}`` with ``Upgrade: ringfence-tcp``: a byte pipe to a port on the
sandbox's own loopback (the host's side of preview URLs and of sandbox groups).

The daemon runs in the sandbox's network namespace, so ``127.0.0.1`` here is the
sandbox's loopback, never the host's: the host reaches a server the sandbox runs without
the sandbox gaining any inbound network. The only input is the port number; the address
is always ``127.0.0.1``, then ``::1`` (nothing else can be named). The daemon's own port,
when it listens on TCP (a Pod's), is refused: a tunnel must not drive the daemon.

Answers: ``101 Switching Protocols`` then the raw bytes both ways until both sides have
ended; or, asked with ``Ringfence-Pass-Fd: 1`` on a unix socket, ``200`` with the
connected socket itself passed along (SCM_RIGHTS), so the host speaks to the port with no
thread of the daemon's in between; ``400`` for a malformed request; ``403`` for the
daemon's own port or the group port; ``502`` with ``{"code": 502, "message": ...}`` when
nothing listens on the port.

``GET /group/accept`` with the same upgrade: the other way round, for sandbox groups. The
daemon listens on ``127.0.0.1:GROUP_PORT`` in the sandbox (from the first such request
on), answers ``101`` at once, and the connection then waits for one connection of a
process in the sandbox to that port; from then on the two are spliced. The host keeps a
few of these waiting, reads what the process asks for (``CONNECT peer:port``), decides it
and answers the process itself: the daemon decides nothing. ``409`` when the port is taken.
"""

from __future__ import annotations

import _thread

from ._codec import dumps
from .methods import GROUP_PORT

__all__ = ["UPGRADE", "serve", "serve_group"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _socket import socket

    from ._http import Conn, Request

UPGRADE = "ringfence-tcp"
PASS_FD = "ringfence-pass-fd"  # "1": hand the connected socket over instead (a unix socket)
_CONNECT_SECONDS = 5.0  # a loopback connect is immediate; only a full backlog waits
_DRAIN_SECONDS = 60.0  # after the host's side ends: how long the sandbox's may still answer
_CHUNK = 64 * 1024
_JSON = [("Content-Type", "application/json")]


def port_of(path: str) -> int | None:
    """The port of ``/ports/{port}``: decimal, 1 to 65535, no sign or leading zero."""
    digits = path[len("/ports/") :]
    if not (0 < len(digits) <= 5 and digits.isdigit() and digits.isascii()):
        return None
    if digits[0] == "0":
        return None
    port = int(digits)
    return port if port <= 65535 else None


def _refuse(conn: Conn, status: int, message: str) -> None:
    conn.close_after = True
    conn.respond(status, _JSON, dumps({"code": status, "message": message}).encode())


def _connect(port: int) -> socket | None:
    """A connection to ``port`` on the sandbox's loopback (IPv4, then IPv6), or None."""
    from _socket import AF_INET, AF_INET6, IPPROTO_TCP, SOCK_STREAM, TCP_NODELAY
    from _socket import socket as Socket

    for family, address in ((AF_INET, ("127.0.0.1", port)), (AF_INET6, ("::1", port, 0, 0))):
        try:
            target = Socket(family, SOCK_STREAM)
        except OSError:
            continue
        try:
            target.settimeout(_CONNECT_SECONDS)
            target.connect(address)
            target.settimeout(None)
            target.setsockopt(IPPROTO_TCP, TCP_NODELAY, 1)
            return target
        except OSError:
            target.close()
    return None


def serve(request: Request, conn: Conn, own_port: int | None) -> None:
    """Answer one tunnel request; with a 101 the connection is the tunnel's until it ends
    (the caller closes the socket afterwards)."""
    port = port_of(request.path)
    if request.method != "GET" or port is None:
        _refuse(conn, 400, "a tunnel is GET /ports/{port} with a port from 1 to 65535")
        return
    if request.headers.get("upgrade", "").lower() != UPGRADE:
        _refuse(conn, 400, f"a tunnel needs Upgrade: {UPGRADE}")
        return
    if port in (own_port, GROUP_PORT):
        _refuse(conn, 403, f"port {port} is the sandbox daemon's own")
        return
    target = _connect(port)
    if target is None:
        _refuse(conn, 502, f"nothing listens on port {port} in the sandbox")
        return
    try:
        conn.close_after = True
        conn.body = None
        early = conn.take_buffered()  # what the host sent right behind the request head
        if early:
            target.sendall(early)
        if request.headers.get(PASS_FD, "") == "1" and own_port is None:
            _hand_over(conn, target)
            return
        conn.send(
            f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {UPGRADE}\r\n"
            "Connection: Upgrade\r\n\r\n".encode()
        )
        _splice(conn.sock, target)
    except OSError:
        pass
    finally:
        target.close()


def _hand_over(conn: Conn, target: socket) -> None:
    """Pass the connected socket itself to the host (SCM_RIGHTS on the unix socket), with
    ``200`` and ``Ringfence-Fd: 1``: the host then speaks to the port directly, no thread
    of ours in between. The socket stays the sandbox's namespace's (its loopback)."""
    import sys
    from _socket import SCM_RIGHTS, SOL_SOCKET

    head = b"HTTP/1.1 200 OK\r\nRingfence-Fd: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    fd = target.fileno().to_bytes(4, sys.byteorder)
    conn.sock.sendmsg([head], [(SOL_SOCKET, SCM_RIGHTS, fd)])


_group: list[socket] = []  # the group port's listener, once made
_group_lock = _thread.allocate_lock()


def _group_listener() -> socket | None:
    """The listener on the group port (made once), or None when it cannot be bound."""
    from _socket import AF_INET, SO_REUSEADDR, SOCK_STREAM, SOL_SOCKET
    from _socket import socket as Socket

    with _group_lock:
        if not _group:
            listener = Socket(AF_INET, SOCK_STREAM)
            try:
                listener.setsockopt(SOL_SOCKET, SO_REUSEADDR, 1)
                listener.bind(("127.0.0.1", GROUP_PORT))
                listener.listen(64)
            except OSError:
                listener.close()
                return None
            _group.append(listener)
        return _group[0]


def serve_group(request: Request, conn: Conn) -> None:
    """Answer one ``/group/accept``: 101, then wait for a process's connection to the
    group port and splice the two (the caller closes the socket afterwards)."""
    if request.method != "GET" or request.headers.get("upgrade", "").lower() != UPGRADE:
        _refuse(conn, 400, f"an accept is GET /group/accept with Upgrade: {UPGRADE}")
        return
    listener = _group_listener()
    if listener is None:
        _refuse(conn, 409, f"port {GROUP_PORT} is taken in the sandbox: no group relay")
        return
    conn.send(
        f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {UPGRADE}\r\n"
        "Connection: Upgrade\r\n\r\n".encode()
    )
    conn.close_after = True
    conn.body = None
    from _socket import socket as Socket

    while True:
        try:
            fd, _ = listener._accept()  # type: ignore[attr-defined]
            client = Socket(fileno=fd)
            break
        except InterruptedError:
            continue
        except OSError:
            return
    try:
        if conn.peer_closed():  # the host gave up waiting: this process is not served
            return
        _splice(conn.sock, client)
    except OSError:
        pass
    finally:
        client.close()


def _splice(host: socket, target: socket) -> None:
    """Copy both ways until both have ended: this thread host → target, another thread
    target → host. Each end is passed on as a half-close; once the host's side has ended,
    the sandbox's has ``_DRAIN_SECONDS`` to end too."""
    from _socket import SHUT_RDWR, SHUT_WR

    done = _thread.allocate_lock()
    done.acquire()

    def back() -> None:
        try:
            _copy(target, host)
            _shutdown(host, SHUT_WR)
        finally:
            done.release()

    _thread.start_new_thread(back, ())
    try:
        _copy(host, target)
    finally:
        _shutdown(target, SHUT_WR)
        if not done.acquire(True, _DRAIN_SECONDS):
            _shutdown(target, SHUT_RDWR)
            _shutdown(host, SHUT_RDWR)
            done.acquire()


def _copy(source: socket, sink: socket) -> None:
    """Until ``source`` ends or either side fails (a failure ends both directions)."""
    from _socket import SHUT_RDWR

    try:
        while True:
            data = source.recv(_CHUNK)
            if not data:
                return
            sink.sendall(data)
    except OSError:
        _shutdown(source, SHUT_RDWR)
        _shutdown(sink, SHUT_RDWR)


def _shutdown(sock: socket, how: int) -> None:
    try:  # noqa: SIM105 - contextlib costs memory
        sock.shutdown(how)
    except OSError:
        pass
