"""The hop to a sandbox daemon: what crosses it, against a real socket that records it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ringfence.errors import SandboxNotRunning
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
    with pytest.raises(SandboxNotRunning, match="sb1"):
        await client.send("GET", "/health")
