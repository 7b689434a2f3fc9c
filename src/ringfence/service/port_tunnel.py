"""The control plane's side of a daemon's port tunnel (``sandboxd/_tunnel.py``).

A tunnel is a connection of its own to the daemon's socket, upgraded into a byte pipe to
a port on the sandbox's loopback. Whatever flows through it afterwards is the sandbox's
server's, untrusted; only the upgrade's answer is read here, bounded.

On a daemon reached over a unix socket (the local backend's), the daemon hands the
connected socket itself over (SCM_RIGHTS) instead of copying bytes through two threads of
its own: the host then speaks to the sandbox's port directly (a socket made in the
sandbox's namespace: its loopback, nothing else). What is handed over is checked to be a
connected TCP socket, else refused; one a daemon behind a TCP relay cannot hand over (a
Pod's) comes back as the upgraded byte pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
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
    status, body, pipe = await _handed_over(socket_path, sandbox_id, port)
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


async def _handed_over(
    socket_path: str, sandbox_id: str, port: int
) -> tuple[int, bytes, Pipe | None]:
    """``/ports/{port}`` asking for the socket itself: (200, b"", a pipe on the handed-over
    socket), (101, b"", the upgraded pipe) or (status, its bounded body, None)."""
    loop = asyncio.get_running_loop()
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.setblocking(False)
    handed: list[int] = []
    try:
        try:
            async with asyncio.timeout(_CONNECT_SECONDS):
                await loop.sock_connect(unix, socket_path)
        except (OSError, TimeoutError) as exc:
            raise SandboxNotRunning(
                f"sandbox {sandbox_id} is not running (its daemon cannot be reached: "
                f"{getattr(exc, 'strerror', None) or type(exc).__name__})"
            ) from exc
        request = (
            f"GET /ports/{port} HTTP/1.1\r\nHost: sandbox\r\nConnection: Upgrade\r\n"
            f"Upgrade: {UPGRADE}\r\nRingfence-Pass-Fd: 1\r\n\r\n"
        ).encode()
        try:
            await loop.sock_sendall(unix, request)
            async with asyncio.timeout(_ANSWER_SECONDS):
                data = await _head_with_fds(loop, unix, handed)
                end = data.index(b"\r\n\r\n") + 4
                status, length = _answer(data[:end], sandbox_id)
                if status == 200 and handed:
                    pipe = await _pipe_on(handed.pop(0), sandbox_id)
                    unix.close()
                    return status, b"", pipe
                if status == 101:
                    return status, b"", await _pipe_over(loop, unix, data[end:])
                body = data[end:]
                while len(body) < length:
                    chunk = await loop.sock_recv(unix, _MAX_BODY)
                    if not chunk:
                        break
                    body += chunk
        except (OSError, ValueError) as exc:
            raise SandboxNotRunning(
                f"sandbox {sandbox_id} is not running (its daemon broke the tunnel: {exc})"
            ) from exc
        except TimeoutError as exc:
            raise SandboxError(f"sandbox {sandbox_id}: its daemon did not open the tunnel") from exc
        if status == 200:
            raise SandboxError(f"sandbox {sandbox_id}: its daemon handed over no socket")
        unix.close()
        return status, body[:length], None
    except BaseException:
        unix.close()
        raise
    finally:
        for fd in handed:
            with contextlib.suppress(OSError):
                socket.close(fd)


async def _head_with_fds(
    loop: asyncio.AbstractEventLoop, unix: socket.socket, handed: list[int]
) -> bytes:
    """The answer's head (and what came with it), descriptors passed with it in ``handed``.

    Raises:
        ValueError: the daemon closed, or sent more than a head, first.
    """
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > _MAX_HEAD:
            raise ValueError("its answer head is too large")
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(unix.fileno(), _set_once, readable)
        try:
            await readable
        finally:
            loop.remove_reader(unix.fileno())
        try:
            chunk, ancillary, _, _ = unix.recvmsg(_MAX_HEAD, socket.CMSG_SPACE(4))
        except (BlockingIOError, InterruptedError):
            continue
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                whole = len(payload) - len(payload) % 4
                handed.extend(
                    int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, whole, 4)
                )
        if not chunk:
            raise ValueError("it closed the connection before answering")
        data += chunk
    return data


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _pipe_on(fd: int, sandbox_id: str) -> Pipe:
    """A pipe on a handed-over descriptor, once it is a connected TCP socket.

    Raises:
        SandboxError: it is anything else.
    """
    try:
        tcp = socket.socket(fileno=fd)
    except OSError as exc:
        socket.close(fd)
        raise SandboxError(f"sandbox {sandbox_id}: its daemon handed over no socket") from exc
    try:
        if tcp.family not in (socket.AF_INET, socket.AF_INET6) or tcp.type != socket.SOCK_STREAM:
            raise OSError("not a TCP socket")
        tcp.getpeername()  # connected, or OSError
        tcp.setblocking(False)
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader, writer = await asyncio.open_connection(sock=tcp, limit=_LIMIT)
    except OSError as exc:
        tcp.close()
        raise SandboxError(
            f"sandbox {sandbox_id}: its daemon handed over no connected TCP socket"
        ) from exc
    return Pipe(reader, writer)


async def _pipe_over(loop: asyncio.AbstractEventLoop, unix: socket.socket, extra: bytes) -> Pipe:
    """The upgraded unix connection as a pipe, ``extra`` (read with the head) first."""
    reader = asyncio.StreamReader(limit=_LIMIT, loop=loop)
    if extra:
        reader.feed_data(extra)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=unix)
    return Pipe(reader, asyncio.StreamWriter(transport, protocol, reader, loop))


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
