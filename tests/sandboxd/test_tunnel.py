"""The daemon's port tunnel (``GET /ports/{port}``, ``Upgrade: ringfence-tcp``).

Here the daemon runs on the host, so its loopback is the host's: these tests pin the
protocol; that the loopback is the sandbox's own is tests/server/test_ports_local.py's.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringfence.sandboxd.methods import GROUP_PORT
from tests.sandboxd.conftest import PACKAGE, PYTHON, Daemon


def _open(path: str, request: bytes) -> tuple[socket.socket, bytes]:
    """Send ``request`` on a new connection; the answer's head (and what came with it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return sock, data


def _tunnel_request(port: object, early: bytes = b"") -> bytes:
    return (
        f"GET /ports/{port} HTTP/1.1\r\nHost: sandbox\r\nConnection: Upgrade\r\n"
        "Upgrade: ringfence-tcp\r\n\r\n"
    ).encode() + early


@pytest.fixture
def echo_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that echoes each connection's bytes, upper-cased, and
    half-closes when its client does."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())
            conn.shutdown(socket.SHUT_WR)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def test_a_tunnel_carries_bytes_both_ways_and_passes_the_end_on(
    daemon: Daemon, echo_server: int
) -> None:
    sock, head = _open(daemon.path, _tunnel_request(echo_server, early=b"sent early "))
    with sock:
        status, _, rest = head.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 101 "), head
        assert b"upgrade: ringfence-tcp" in status.lower()
        sock.sendall(b"and later")
        sock.shutdown(socket.SHUT_WR)
        received = rest
        while chunk := sock.recv(65536):
            received += chunk
    assert received == b"SENT EARLY AND LATER"


def test_nothing_listening_is_a_502_naming_the_port(daemon: Daemon) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # bound once, now free: nothing listens there
    sock, head = _open(daemon.path, _tunnel_request(port))
    with sock:
        assert head.startswith(b"HTTP/1.1 502 "), head
        body = head.partition(b"\r\n\r\n")[2]
        while len(body) < int(_header(head, b"content-length")):
            body += sock.recv(65536)
    assert json.loads(body) == {
        "code": 502,
        "message": f"nothing listens on port {port} in the sandbox",
    }


@pytest.mark.parametrize("port", ["0", "65536", "080", "-1", "+80", "8o", "", "1" * 6, "٣"])
def test_a_port_out_of_range_or_not_decimal_is_refused(daemon: Daemon, port: str) -> None:
    sock, head = _open(daemon.path, _tunnel_request(port))
    sock.close()
    assert head.startswith(b"HTTP/1.1 400 "), head


def test_a_tunnel_needs_its_upgrade_header(daemon: Daemon, echo_server: int) -> None:
    request = f"GET /ports/{echo_server} HTTP/1.1\r\nHost: sandbox\r\n\r\n".encode()
    sock, head = _open(daemon.path, request)
    sock.close()
    assert head.startswith(b"HTTP/1.1 400 "), head


def test_the_daemons_own_tcp_port_is_refused(tmp_path: Path) -> None:
    """A Pod's daemon listens on TCP: a tunnel to that port would drive the daemon."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    own = listener.getsockname()[1]
    code = f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); import sandboxd.__main__"
    proc = subprocess.Popen(
        [PYTHON, "-I", "-S", "-B", "-c", code, "--listen-fd", str(listener.fileno())],
        pass_fds=[listener.fileno()],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    try:
        sock = socket.create_connection(("127.0.0.1", own), timeout=10)
        with sock:
            sock.sendall(_tunnel_request(own))
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                head += chunk
        assert head.startswith(b"HTTP/1.1 403 "), head
    finally:
        listener.close()
        proc.kill()
        proc.wait()


def _header(head: bytes, name: bytes) -> bytes:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    raise KeyError(name)


def test_a_group_accept_hands_over_a_process_connection_to_the_group_port(
    daemon: Daemon,
) -> None:
    """The daemon's side of groups: it listens on the group port; an accept waits, then
    carries one connection to it, both ways. (On the host here: a sandbox's own port.)"""
    request = (
        b"GET /group/accept HTTP/1.1\r\nHost: sandbox\r\nConnection: Upgrade\r\n"
        b"Upgrade: ringfence-tcp\r\n\r\n"
    )
    accept, head = _open(daemon.path, request)
    with accept:
        assert head.startswith(b"HTTP/1.1 101 "), head
        process = socket.create_connection(("127.0.0.1", GROUP_PORT), timeout=10)
        with process:
            process.sendall(b"CONNECT peer:80 HTTP/1.1\r\n\r\n")
            assert accept.recv(65536) == b"CONNECT peer:80 HTTP/1.1\r\n\r\n"
            accept.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
            assert process.recv(65536) == b"HTTP/1.1 200 OK\r\n\r\n"
    tunnel, head = _open(daemon.path, _tunnel_request(GROUP_PORT))
    tunnel.close()
    assert head.startswith(b"HTTP/1.1 403 "), head  # a port tunnel never reaches it


def test_on_a_unix_socket_the_daemon_can_hand_the_connected_socket_over(
    daemon: Daemon, echo_server: int
) -> None:
    """Asked with Ringfence-Pass-Fd, the daemon passes the socket it connected (SCM_RIGHTS):
    the host then speaks to the port with no thread of the daemon's in between."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(daemon.path)
    with sock:
        sock.sendall(
            _tunnel_request(echo_server).replace(b"\r\n\r\n", b"\r\nRingfence-Pass-Fd: 1\r\n\r\n")
        )
        head, fds, _, _ = socket.recv_fds(sock, 65536, 1)
    assert head.startswith(b"HTTP/1.1 200 ") and b"Ringfence-Fd: 1" in head, head
    assert len(fds) == 1
    with socket.socket(fileno=fds[0]) as handed:
        assert handed.getpeername()[1] == echo_server
        handed.settimeout(10)
        handed.sendall(b"direct")
        handed.shutdown(socket.SHUT_WR)
        assert handed.recv(65536) == b"DIRECT"
