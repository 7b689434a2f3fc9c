"""The control plane's side of a daemon's port tunnel (``sandboxd/_tunnel.py``).

A tunnel is a connection of its own to the daemon's socket, upgraded into a byte pipe to
a port on the sandbox's loopback. Whatever flows through it afterwards is the sandbox's
server's, untrusted; only the upgrade's answer is read here, bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

from ringfence.errors import Forbidden, PortNotListening, SandboxError, SandboxNotRunning

__all__ = ["Pipe", "open_group_accept", "open_tunnel"]

UPGRADE = "ringfence-tcp"  # the daemon's (sandboxd/_tunnel.py), which imports nothing of ours
_CONNECT_SECONDS = 10.0
_ANSWER_SECONDS = 15.0  # the daemon's loopback connect waits at most 5 s
_MAX_HEAD = 16 * 1024
_MAX_BODY = 4096
_LIMIT = 256 * 1024  # the pipe's read buffer


@dataclass
class Pipe:
    """An open tunnel: bytes written go to the sandbox's port, bytes read come from it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self.writer.wait_closed()


async def open_tunnel(socket_path: str, sandbox_id: str, port: int) -> Pipe:
    """A pipe to ``port`` on the sandbox's loopback, through its daemon at ``socket_path``.

    Raises:
        PortNotListening: nothing listens on ``port`` in the sandbox.
        Forbidden: the port is the daemon's own.
        SandboxNotRunning: the daemon cannot be reached (the sandbox has ended).
        SandboxError: the daemon answered something else, or nothing in time.
    """
    status, body, pipe = await _upgrade(socket_path, sandbox_id, f"/ports/{port}")
    if pipe is not None:
        return pipe
    message = _message(body)
    if status == 502:
        raise PortNotListening(f"nothing listens on port {port} in sandbox {sandbox_id}")
    if status == 403:
        raise Forbidden(f"port {port} of sandbox {sandbox_id} cannot be reached: {message}")
    raise SandboxError(f"sandbox {sandbox_id}: its daemon refused the tunnel ({status}: {message})")


async def open_group_accept(socket_path: str, sandbox_id: str) -> Pipe:
    """A pipe that waits for one connection of a process in the sandbox to its group port
    (the daemon's listener there), then carries it.

    Raises:
        SandboxNotRunning: the daemon cannot be reached (the sandbox has ended).
        SandboxError: the daemon refused (the port is taken in the sandbox).
    """
    status, body, pipe = await _upgrade(socket_path, sandbox_id, "/group/accept")
    if pipe is not None:
        return pipe
    raise SandboxError(f"sandbox {sandbox_id}: no group relay ({status}: {_message(body)})")


async def _upgrade(socket_path: str, sandbox_id: str, path: str) -> tuple[int, bytes, Pipe | None]:
    """The daemon's answer to an upgrade of ``path``: (101, b"", the pipe) or (status,
    its bounded body, None)."""
    try:
        async with asyncio.timeout(_CONNECT_SECONDS):
            reader, writer = await asyncio.open_unix_connection(socket_path, limit=_LIMIT)
    except (OSError, TimeoutError) as exc:
        raise SandboxNotRunning(
            f"sandbox {sandbox_id} is not running (its daemon cannot be reached: "
            f"{getattr(exc, 'strerror', None) or type(exc).__name__})"
        ) from exc
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: sandbox\r\nConnection: Upgrade\r\n"
            f"Upgrade: {UPGRADE}\r\n\r\n".encode()
        )
        async with asyncio.timeout(_ANSWER_SECONDS):
            head = await reader.readuntil(b"\r\n\r\n")
            status, length = _answer(head, sandbox_id)
            if status == 101:
                return status, b"", Pipe(reader, writer)
            body = await reader.readexactly(length) if length else b""
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        writer.close()
        raise SandboxNotRunning(
            f"sandbox {sandbox_id} is not running (its daemon broke the tunnel: {exc})"
        ) from exc
    except TimeoutError as exc:
        writer.close()
        raise SandboxError(f"sandbox {sandbox_id}: its daemon did not open the tunnel") from exc
    except BaseException:
        writer.close()
        raise
    writer.close()
    return status, body, None


def _answer(head: bytes, sandbox_id: str) -> tuple[int, int]:
    """The status and Content-Length of the daemon's answer head."""
    if len(head) > _MAX_HEAD:
        raise SandboxError(f"sandbox {sandbox_id}: its daemon's answer head is too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or parts[0] != "HTTP/1.1" or not parts[1].isdigit():
        raise SandboxError(f"sandbox {sandbox_id}: its daemon's answer is not HTTP")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            value = value.strip()
            if not value.isdigit() or int(value) > _MAX_BODY:
                raise SandboxError(f"sandbox {sandbox_id}: its daemon's refusal is too large")
            length = int(value)
    return int(parts[1]), length


def _message(body: bytes) -> str:
    try:
        decoded = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")[:200]
    return str(decoded.get("message", ""))[:200] if isinstance(decoded, dict) else ""
