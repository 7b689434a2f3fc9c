"""A refusal given before the request's body was read, against a real ``ringfence serve`` on
loopback: E2B's SDK (hyper underneath) dropped the connection without reading a 401 that came
back while it was still writing its upload, about one ``files.write`` in ten. The server now
reads the rest of the body first, within bounds a client without a key cannot stretch."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import pytest

from tests.server.test_serve_process import Server

LIMIT = 64 * 1024  # RINGFENCE_MAX_REQUEST_BYTES here
_BOUND = 60.0  # seconds any wait here may take before the test fails
_QUIET = 1.0  # seconds in which a server that answers before the body would have answered

# Early refusals, no key or token: a native streamed upload, an E2B multipart upload.
_REFUSED = {
    "native": "PUT /v1/sandboxes/sbx_nope/files?path=/tmp/x HTTP/1.1\r\n"
    "Authorization: Bearer rf_garbage\r\n",
    "e2b": "POST /files?path=/home/user/x HTTP/1.1\r\nE2b-Sandbox-Id: sbx_nope\r\n"
    "E2b-Sandbox-Port: 49983\r\nX-Access-Token: garbage\r\n",
}


_CODES: dict[str, object] = {"native": "unauthenticated", "e2b": 401}


def _code(body: bytes) -> object:
    """The error's code, in the native shape or E2B's."""
    error = json.loads(body)
    return error["error"]["code"] if "error" in error else error["code"]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(
        tmp_path_factory.mktemp("refusals") / "data",
        None,
        env={
            "RINGFENCE_MAX_REQUEST_BYTES": str(LIMIT),
            "RINGFENCE_REQUEST_HEAD_TIMEOUT": "120",  # the drain's own bounds are tested
            "RINGFENCE_POOL_SIZES": "{}",
        },
    )
    server.start()
    yield server
    server.stop()


def _connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(_BOUND)
    return sock


def _head(route: str, length: int | None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        f"{_REFUSED[route]}Host: rf\r\nContent-Type: application/octet-stream\r\n{framing}\r\n\r\n"
    ).encode()


def _answer(sock: socket.socket) -> tuple[int, bytes, bytes]:
    """The status, head and body of one answer (by its Content-Length)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        assert chunk, f"closed before its answer: {answer!r}"
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        int(line.partition(b":")[2])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed in its answer: {answer!r}"
        body += chunk
    return int(head.split(b" ", 2)[1]), head.lower(), body


@pytest.mark.parametrize("route", sorted(_REFUSED))
def test_a_refusal_waits_for_the_body_the_client_is_still_sending(
    started: Server, route: str
) -> None:
    body = b"x" * (LIMIT // 2)
    with _connect(started) as sock:
        sock.sendall(_head(route, len(body)) + body[:100])
        # Nothing may come back while the body is unfinished (the server would answer in
        # milliseconds); then the refusal, on a connection that stays open for the next.
        assert not select.select([sock], [], [], _QUIET)[0], sock.recv(65536)
        sock.sendall(body[100:])
        status, head, answer = _answer(sock)
        assert (status, _code(answer)) == (401, _CODES[route]), answer
        assert b"connection: close" not in head
        sock.sendall(_head(route, 0))
        assert _answer(sock)[0] == 401


@pytest.mark.parametrize("route", sorted(_REFUSED))
def test_a_body_past_the_limit_is_not_read_for_a_refusal(started: Server, route: str) -> None:
    """A client without a key that sends without end is cut off near the limit: the server
    stops reading, answers with ``Connection: close`` and closes."""
    chunk = b"%x\r\n%s\r\n" % (LIMIT, b"x" * LIMIT)
    sent = 0
    most = 64 << 20  # far past the limit and the loopback's socket buffers
    with _connect(started) as sock:
        sock.sendall(_head(route, None))
        deadline = time.monotonic() + _BOUND
        try:
            while sent < most:
                assert time.monotonic() < deadline, "the server neither read nor closed"
                sent += sock.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert sent < most, "the server read the body without end"


@pytest.mark.parametrize("route", sorted(_REFUSED))
def test_a_declared_body_past_the_limit_is_refused_unread(started: Server, route: str) -> None:
    with _connect(started) as sock:
        sock.sendall(_head(route, 1 << 30))
        status, head, answer = _answer(sock)
        assert (status, _code(answer)) == (401, _CODES[route]), answer
        assert b"connection: close" in head
        assert sock.recv(65536) == b""  # closed, nothing of the body read
