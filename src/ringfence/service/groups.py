"""Sandbox groups: sandboxes a tenant puts in one group reach each other's ports, nothing
else (docs/design.md 14.6).

Inside a grouped sandbox, ``127.0.0.1:GROUP_PORT`` is an HTTP proxy for its peers:
``CONNECT {peer_id}:{port}`` (any TCP), or a plain request to ``http://{peer_id}:{port}/...``
or ``http://{port}-{peer_id}/...`` (``curl -x http://127.0.0.1:49982 http://sb…:8000/``;
``RINGFENCE_GROUP_PROXY`` holds that URL). The sandbox gains no network for it: the
daemon listens there and hands each connection to the host through a connection the host
keeps waiting (``port_tunnel.open_group_accept``); the host reads what is asked, admits
it as a caller of the peer's port (``Ports.admit``: same tenant and same group, or "not
found" for any other sandbox, whoever's; never a port Ringfence listens on), and splices
it to a tunnel into the peer (stage 1's). Each reach is audited as the peer's
``sandbox.port_open`` with the source sandbox as actor and counts against the peer's
connection bound. Nothing else is reachable: the name is a sandbox id, never an address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass

from ringfence.errors import (
    Forbidden,
    InvalidRequest,
    NotFound,
    PortNotListening,
    RingfenceError,
    SandboxNotRunning,
    TooManyRequests,
    Unauthenticated,
)
from ringfence.sandboxd.methods import GROUP_PORT
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.port_tunnel import Pipe, open_group_accept
from ringfence.service.ports import PortCaller, Ports, Tunnel

__all__ = ["GROUP_PROXY", "GROUP_PROXY_VARIABLE", "GroupRelays"]

log = logging.getLogger(__name__)

GROUP_PROXY = f"http://127.0.0.1:{GROUP_PORT}"
GROUP_PROXY_VARIABLE = "RINGFENCE_GROUP_PROXY"  # set in every grouped sandbox
_WAITING = 4  # connections kept waiting per grouped sandbox: concurrent handshakes
# Connections of one grouped sandbox served (or waited on) at once: each is a host task
# and descriptor; past it the next waits in the sandbox's daemon (review 2a #7).
_MOST_HANDLERS = 64
_MAX_HEAD = 16 * 1024
_HEAD_SECONDS = 10.0  # from a process's connection to its whole request head
_CHUNK = 64 * 1024
_RETRY_SECONDS = 0.5
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9]{1,64}$")
_PORT_LABEL = re.compile(r"^([0-9]{1,5})-([A-Za-z0-9]{1,64})$")
_DROPPED = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")


@dataclass(frozen=True)
class _Asked:
    peer: str
    port: int
    connect: bool  # CONNECT (a byte pipe) rather than one plain HTTP request
    head: bytes  # for a plain request: its head as the peer's server is sent it


class GroupRelays:
    """The group relays of the sandboxes this process runs (one per grouped sandbox)."""

    def __init__(self, ports: Ports) -> None:
        self._ports = ports
        self._relays: dict[str, list[asyncio.Task[None]]] = {}
        self._handlers: set[asyncio.Task[None]] = set()

    def start(self, tenant: str, sandbox_id: str, group: str, daemon: DaemonClient) -> None:
        """Serve the sandbox's group port until ``stop`` (its end)."""
        caller = PortCaller(tenant, f"sandbox:{sandbox_id}", "group", group)
        slots = asyncio.Semaphore(_MOST_HANDLERS)  # this sandbox's waiting and served
        self._relays[sandbox_id] = [
            asyncio.create_task(self._wait(caller, sandbox_id, daemon, slots))
            for _ in range(_WAITING)
        ]

    async def stop(self, sandbox_id: str) -> None:
        for task in self._relays.pop(sandbox_id, []):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def aclose(self) -> None:
        for sandbox_id in list(self._relays):
            await self.stop(sandbox_id)
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _wait(
        self, caller: PortCaller, sandbox_id: str, daemon: DaemonClient, slots: asyncio.Semaphore
    ) -> None:
        """Keep one connection waiting on the daemon; hand each process it brings to a
        handler, and wait again, each holding one of ``slots`` (waiting or served) until it
        ends. Ends with the sandbox (its daemon gone)."""
        while True:
            await slots.acquire()
            handed = False
            try:
                try:
                    pipe = await open_group_accept(daemon.socket_path, sandbox_id)
                except SandboxNotRunning:
                    return
                except RingfenceError as exc:
                    log.warning("sandbox %s: its group relay stops: %s", sandbox_id, exc.message)
                    return
                try:
                    first = await pipe.reader.read(_CHUNK)  # waits for a process to connect
                except OSError:
                    first = b""
                if not first:
                    await pipe.aclose()
                    await asyncio.sleep(_RETRY_SECONDS)  # a daemon going away: do not spin
                    continue
                handler = asyncio.create_task(self._serve(caller, pipe, first))
                handed = True
                self._handlers.add(handler)
                handler.add_done_callback(self._handlers.discard)
                handler.add_done_callback(lambda _: slots.release())
            finally:
                if not handed:
                    slots.release()

    async def _serve(self, caller: PortCaller, pipe: Pipe, first: bytes) -> None:
        """One process's connection: read what it asks, admit it, splice it to the peer."""
        tunnel: Tunnel | None = None
        try:
            try:
                head, rest = await _read_head(pipe, first)
                asked = _asked(head)
                admitted = await self._ports.admit(caller, asked.peer, asked.port, via="group")
                tunnel = await self._ports.connect(admitted)
            except (RingfenceError, TimeoutError) as exc:
                await _answer_refusal(pipe, exc)
                return
            if asked.connect:
                pipe.writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                tunnel.writer.write(asked.head)
            if rest:
                tunnel.writer.write(rest)
            await _splice(pipe, tunnel)
        except (OSError, ConnectionError):
            pass
        finally:
            if tunnel is not None:
                await tunnel.aclose()
            await pipe.aclose()


async def _read_head(pipe: Pipe, first: bytes) -> tuple[bytes, bytes]:
    """The request head (through its blank line) and what came behind it.

    Raises:
        InvalidRequest: no whole head within 16 KiB. TimeoutError: nor within 10 s.
    """
    data = first
    async with asyncio.timeout(_HEAD_SECONDS):
        while b"\r\n\r\n" not in data:
            if len(data) > _MAX_HEAD:
                raise InvalidRequest("the request head is larger than 16 KiB")
            chunk = await pipe.reader.read(_CHUNK)
            if not chunk:
                raise InvalidRequest("the connection closed before its request head ended")
            data += chunk
    end = data.index(b"\r\n\r\n") + 4
    if end > _MAX_HEAD:
        raise InvalidRequest("the request head is larger than 16 KiB")
    return data[:end], data[end:]


def _asked(head: bytes) -> _Asked:
    """What a process asks of the group proxy.

    Raises:
        InvalidRequest: not ``CONNECT peer:port`` nor an absolute ``http://`` URL naming a
            peer (a sandbox id with a port, or ``{port}-{id}``).
    """
    lines = head[:-4].split(b"\r\n")
    try:
        method, target, version = lines[0].decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("the request line is malformed") from None
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise InvalidRequest("only HTTP/1.x is spoken here")
    if method == "CONNECT":
        peer, port = _peer(target, default_port=None)
        return _Asked(peer, port, True, b"")
    if not target.lower().startswith("http://"):
        raise InvalidRequest(
            "ask for a peer as CONNECT {sandbox_id}:{port} or an absolute URL "
            "http://{sandbox_id}:{port}/... (or http://{port}-{sandbox_id}/...)"
        )
    authority, slash, path = target[len("http://") :].partition("/")
    peer, port = _peer(authority, default_port=80)
    kept = [line for line in lines[1:] if line.split(b":", 1)[0].strip().lower() not in _DROPPED]
    request = f"{method} /{path if slash else ''} {version}".encode()
    rewritten = b"\r\n".join([request, *kept, b"Connection: close"]) + b"\r\n\r\n"
    return _Asked(peer, port, False, rewritten)


def _peer(authority: str, default_port: int | None) -> tuple[str, int]:
    """(peer id, port) of ``{id}:{port}`` or ``{port}-{id}`` (its port from the label)."""
    host, colon, port_text = authority.rpartition(":")
    if not colon:
        host, port_text = authority, ""
    label = _PORT_LABEL.fullmatch(host)
    if label is not None and not port_text:
        return label.group(2), _port(label.group(1))
    if not _SANDBOX_ID.fullmatch(host):
        raise InvalidRequest(f"{host!r} is not a sandbox id: a group reaches its peers only")
    if not port_text:
        if default_port is None:
            raise InvalidRequest("CONNECT names a port: {sandbox_id}:{port}")
        return host, default_port
    return host, _port(port_text)


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < len(text) <= 5 and text[0] != "0"):
        raise InvalidRequest(f"the port is a number from 1 to 65535, not {text!r}")
    port = int(text)
    if port > 65535:
        raise InvalidRequest(f"the port is from 1 to 65535, not {port}")
    return port


_STATUS = {
    InvalidRequest: (400, "Bad Request"),
    Unauthenticated: (403, "Forbidden"),
    Forbidden: (403, "Forbidden"),
    NotFound: (403, "Forbidden"),  # another group's, another tenant's, none: the same
    SandboxNotRunning: (409, "Conflict"),
    TooManyRequests: (429, "Too Many Requests"),
    PortNotListening: (502, "Bad Gateway"),
}


async def _answer_refusal(pipe: Pipe, exc: BaseException) -> None:
    status, reason = 504, "Gateway Timeout"
    message = "the request head did not arrive within 10 s"
    if isinstance(exc, RingfenceError):
        status, reason = next(
            (answer for kind, answer in _STATUS.items() if isinstance(exc, kind)),
            (502, "Bad Gateway"),
        )
        message = exc.message
    body = f"ringfence group: {message}\n".encode()
    pipe.writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(OSError, ConnectionError):
        await pipe.writer.drain()


async def _splice(pipe: Pipe, tunnel: Tunnel) -> None:
    """Bytes both ways until both directions have ended (each end passed on)."""

    async def copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(_CHUNK):
                tunnel.active()  # a peer's traffic is use of it (auto_pause)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, ConnectionError):
            writer.close()

    await asyncio.gather(copy(pipe.reader, tunnel.writer), copy(tunnel.reader, pipe.writer))
