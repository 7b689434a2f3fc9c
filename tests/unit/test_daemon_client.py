"""The hop to a sandbox daemon: what crosses it, against a real socket that records it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringfence.errors import SandboxError, SandboxNotRunning, TooManyRequests
from ringfence.service.daemon_client import DaemonClient

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def _recording_daemon(path: Path, seen: list[bytes]) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        writer.write(ANSWER)
        await writer.drain()

    return await asyncio.start_unix_server(serve, str(path))


async def test_credentials_never_reach_the_daemon(tmp_path: Path) -> None:
    seen: list[bytes] = []
    server = await _recording_daemon(tmp_path / "d.sock", seen)
    client = DaemonClient("sb1", tmp_path / "d.sock")
    response = await client.send(
        "POST",
        "/process.Process/List",
        headers={
            "Authorization": "Bearer rf_0123456789abcdef_secret",
            "X-API-Key": "rf_0123456789abcdef_secret",
            "Cookie": "session=secret",
            "Content-Type": "application/json",
            "Connect-Timeout-Ms": "5000",
        },
        content=b"{}",
    )
    assert response.status_code == 200 and await response.aread() == b"{}"
    await client.aclose()
    server.close()
    head = seen[0].lower()
    assert b"secret" not in head
    assert b"content-type: application/json" in head and b"connect-timeout-ms: 5000" in head


async def test_a_dead_daemon_is_sandbox_not_running(tmp_path: Path) -> None:
    client = DaemonClient("sb1", tmp_path / "nobody-listens.sock")
    with pytest.raises(SandboxNotRunning) as caught:
        await client.send("GET", "/health")
    assert caught.value.code == "sandbox_not_running" and "sb1" in caught.value.message


async def _scripted_daemon(path: Path, answer: bytes, read: bool = True) -> asyncio.Server:
    """A daemon that answers every request with ``answer`` (and, unless ``read`` is False,
    reads the request head first)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if read:
            await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        if not read:
            await asyncio.sleep(30)  # holds the connection, reads nothing

    return await asyncio.start_unix_server(serve, str(path), limit=1 << 20)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n",  # an endless head
        b"HTTP/1.1 100 Continue\r\n\r\n" * 3 + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n",
        b"not http at all\r\n\r\n",
    ],
    ids=["huge-head", "endless-1xx", "status-999", "garbage"],
)
async def test_a_hostile_daemons_answers_are_refused(tmp_path: Path, answer: bytes) -> None:
    server = await _scripted_daemon(tmp_path / "d.sock", answer)
    client = DaemonClient("sb1", tmp_path / "d.sock")
    try:
        with pytest.raises(SandboxNotRunning) as caught:
            await client.send("GET", "/health")
        assert caught.value.code == "sandbox_not_running"
    finally:
        await client.aclose()
        server.close()


async def test_a_length_beside_a_chunked_body_is_not_passed_on(tmp_path: Path) -> None:
    smuggling = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n"
    )
    server = await _scripted_daemon(tmp_path / "d.sock", smuggling)
    client = DaemonClient("sb1", tmp_path / "d.sock")
    response = await client.send("GET", "/files")
    assert response.content_length is None and await response.aread() == b"hello"
    await client.aclose()
    server.close()


async def test_a_daemon_that_stops_reading_an_upload_is_given_up(tmp_path: Path) -> None:
    server = await _scripted_daemon(tmp_path / "d.sock", b"", read=False)
    client = DaemonClient("sb1", tmp_path / "d.sock", write_seconds=0.5)

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"x" * (1 << 20)

    with pytest.raises(SandboxNotRunning):
        await client.send("PUT", "/files", content=endless())
    await client.aclose()
    server.close()


async def test_requests_in_flight_to_one_daemon_are_capped(tmp_path: Path) -> None:
    streaming = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n"  # never ends
    server = await _scripted_daemon(tmp_path / "d.sock", streaming)
    client = DaemonClient("sb1", tmp_path / "d.sock", max_requests=2)
    held = [await client.send("GET", "/watch") for _ in range(2)]
    with pytest.raises(TooManyRequests):
        await client.send("GET", "/watch")
    await held[0].aclose()
    again = await client.send("GET", "/watch")  # a slot came free
    for response in (again, held[1]):
        await response.aclose()
    await client.aclose()
    server.close()


async def test_a_daemon_slow_to_answer_is_not_called_not_running(tmp_path: Path) -> None:
    # It read the request and is busy with it (a remove behind a stuck context): the
    # sandbox still runs, and the error says so.
    took, released = asyncio.Event(), asyncio.Event()
    handlers: list[asyncio.Task[object]] = []

    async def busy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]  # in a task
        try:
            await reader.readuntil(b"\r\n\r\n")
            took.set()
            await released.wait()  # holds the connection open, answers nothing
        finally:
            writer.close()

    server = await asyncio.start_unix_server(busy, str(tmp_path / "d.sock"))
    client = DaemonClient("sb1", tmp_path / "d.sock", head_seconds=0.2)
    try:
        with pytest.raises(SandboxError) as caught:
            await client.send("DELETE", "/contexts/c1")
        assert caught.value.code == "sandbox_error" and "still runs" in caught.value.message
        assert took.is_set()
    finally:
        # Python 3.11's server.close() does not end a handler: it would be destroyed pending.
        released.set()
        await asyncio.wait_for(asyncio.gather(*handlers, return_exceptions=True), 10)
        await client.aclose()
        server.close()
        await server.wait_closed()
