"""Connections before authentication, against a real ``ringfence serve`` on loopback: with no
key, 1,500 connections that trickled their request heads stayed open for 70 s and grew the
server's descriptors without bound."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringfence.server.connections import _Connection, _Unproven, client_of
from tests.server.test_serve_process import Server

CAP = 8  # connections before authentication, per client
_BOUND = 60.0  # seconds any wait here may take before the test fails


@pytest.fixture
def started(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    head_timeout = getattr(request, "param", "1")
    server = Server(
        tmp_path / "data",
        None,
        env={
            "RINGFENCE_REQUEST_HEAD_TIMEOUT": head_timeout,
            "RINGFENCE_MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT": str(CAP),
            "RINGFENCE_POOL_SIZES": "{}",
        },
    )
    server.start()
    yield server
    server.stop()


def _connect(server: Server, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), source_address=(source, 0))
    sock.setblocking(False)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (without waiting)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def _wait_closed(sock: socket.socket) -> None:
    deadline = time.monotonic() + _BOUND
    while not _closed_by_server(sock):
        assert time.monotonic() < deadline, "the server kept the connection open"
        select.select([sock], [], [], 0.5)


def _request(sock: socket.socket, path: str, key: str | None = None) -> int:
    """Send one keep-alive request on ``sock`` and read its answer: the status."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: rf\r\n{auth}\r\n".encode())
    answer = b""
    deadline = time.monotonic() + _BOUND
    while b"\r\n\r\n" not in answer or len(answer) < _length(answer):
        assert time.monotonic() < deadline, answer
        if select.select([sock], [], [], 0.5)[0]:
            chunk = sock.recv(65536)
            assert chunk, f"closed before its answer: {answer!r}"
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _length(answer: bytes) -> int:
    head, _, _ = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(head) + 4


def _key(server: Server) -> str:
    return (server.data_dir / "admin-key").read_text().strip()


def test_slowloris_connections_are_closed_after_the_head_deadline(started: Server) -> None:
    trickling = [_connect(started) for _ in range(CAP - 2)]
    for sock in trickling[1:]:  # heads, a byte at a time
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: rf\r\n")
    # A whole head and then its body, a byte at a time: the key is read after the body.
    trickling[0].sendall(
        b"POST /v1/executions HTTP/1.1\r\nHost: rf\r\nContent-Length: 100000\r\n"
        b"Content-Type: application/json\r\n\r\n"
    )
    silent = _connect(started, "127.0.0.2")  # never sends a byte
    deadline = time.monotonic() + _BOUND
    open_ = list(trickling)
    while open_:  # a header byte at a time: the deadline does not move with them
        assert time.monotonic() < deadline, f"{len(open_)} trickling connections stayed open"
        for sock in list(open_):
            if _closed_by_server(sock):
                open_.remove(sock)
            else:
                try:
                    sock.send(b"X")
                except (BrokenPipeError, ConnectionResetError):
                    open_.remove(sock)
        time.sleep(0.1)  # the attacker's pace, not an ordering of events
    _wait_closed(silent)
    fresh = _connect(started)
    assert _request(fresh, "/v1/health") == 200, "the server still serves"
    for sock in [*trickling, silent, fresh]:
        sock.close()


def test_only_authenticated_connections_idle_for_the_keep_alive(started: Server) -> None:
    anonymous = _connect(started)
    assert _request(anonymous, "/v1/health") == 200
    # Opened only now: its head is sent at once, not after anonymous's round trip, which on
    # a loaded runner could outlast the 1 s head deadline.
    keyed = _connect(started)
    assert _request(keyed, "/v1/whoami", _key(started)) == 200
    _wait_closed(anonymous)  # idle, never authenticated: closed after the head deadline
    assert not _closed_by_server(keyed), "the authenticated one was kept"
    assert _request(keyed, "/v1/health") == 200  # and still serves
    anonymous.close()
    keyed.close()


@pytest.mark.parametrize("started", ["60"], indirect=True)  # no head deadline in the way
def test_the_per_client_cap_holds_while_another_client_is_served(started: Server) -> None:
    held = [_connect(started) for _ in range(CAP)]  # idle, before any authentication
    past = _connect(started)
    _wait_closed(past)  # the cap's, not the deadline's: that is 60 s away
    for sock in held:
        assert not _closed_by_server(sock)
    other = _connect(started, "127.0.0.2")  # another client is served meanwhile
    assert _request(other, "/v1/health") == 200
    # Authenticated connections no longer count: a client with a key keeps its pool.
    keyed = [_connect(started, "127.0.0.3") for _ in range(CAP)]
    for sock in keyed:
        assert _request(sock, "/v1/whoami", _key(started)) == 200
    more = _connect(started, "127.0.0.3")
    assert _request(more, "/v1/whoami", _key(started)) == 200
    for sock in [*held, past, other, *keyed, more]:
        sock.close()


class _Held:
    """A connection in the admission structure, as the protocol holds one."""

    def __init__(self, unproven: _Unproven, client: str) -> None:
        self.closed = False
        self.connection = _Connection(unproven, lambda: None, self._close)
        self.admitted = self.connection.counted(client)

    def _close(self) -> None:
        self.closed = True


def test_a_full_server_closes_its_oldest_unauthenticated_connection_not_a_newcomer() -> None:
    # Every connection starts unauthenticated, keyed clients' too: 16 addresses holding 64
    # each filled the 1,024 slots and every newcomer, anyone's, was refused.
    unproven = _Unproven(per_client=2, in_all=4)
    holders = [_Held(unproven, f"10.0.0.{n}") for n in range(4)]  # two slots each, at most
    assert all(held.admitted for held in holders)
    newcomer = _Held(unproven, "192.0.2.1")
    assert newcomer.admitted, "a newcomer is admitted when all slots are held"
    assert [held.closed for held in holders] == [True, False, False, False], "the oldest goes"
    assert len(unproven.connections) == 4
    newcomer.connection.prove()  # authenticated: no longer counted, never evicted
    for n in range(4):
        assert _Held(unproven, f"10.0.1.{n}").admitted
    assert not newcomer.closed and all(held.closed for held in holders)
    # The per-client cap still refuses its client's newcomer: that client holds the slots.
    assert _Held(unproven, "10.0.2.1").admitted and _Held(unproven, "10.0.2.1").admitted
    assert not _Held(unproven, "10.0.2.1").admitted


def test_ipv6_clients_are_counted_by_their_48() -> None:
    # One site is given a /48: by /64 it held 65,536 per-client caps.
    assert client_of("2001:db8:1:2::1") == client_of("2001:db8:1:ffff::1") == "2001:db8:1::/48"
    assert client_of("2001:db8:2::1") != client_of("2001:db8:1::1")
    assert client_of("::ffff:192.0.2.1") == "192.0.2.1"


def test_a_full_server_serves_a_newcomer_and_closes_its_oldest_idle_connection(
    tmp_path: Path,
) -> None:
    server = Server(
        tmp_path / "data",
        None,
        env={
            "RINGFENCE_REQUEST_HEAD_TIMEOUT": "60",  # no head deadline in the way
            "RINGFENCE_MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT": str(CAP),
            "RINGFENCE_MAX_UNAUTHENTICATED_CONNECTIONS": "4",
            "RINGFENCE_POOL_SIZES": "{}",
        },
    )
    server.start()
    try:
        held = [_connect(server, f"127.0.0.{n}") for n in (1, 1, 2, 2)]  # every slot
        assert _request(held[-1], "/v1/health") == 200  # all four are admitted by now
        newcomer = _connect(server, "127.0.0.3")
        assert _request(newcomer, "/v1/health") == 200, "the newcomer is served"
        _wait_closed(held[0])  # the oldest made room
        assert not any(_closed_by_server(sock) for sock in held[1:])
        for sock in [*held, newcomer]:
            sock.close()
    finally:
        server.stop()
