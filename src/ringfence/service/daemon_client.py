"""The control plane's side of a sandbox daemon: HTTP/1.1 over the daemon's unix socket.

Every command and file call crosses this hop, so it is lean: h11 parses the protocol and
asyncio streams move the bytes, with a few idle connections kept per daemon. (httpx over a
unix socket measured about 6 ms more per command here, most of the round-trip goal.)

The daemon is inside the sandbox, so everything it answers is untrusted: answers are
streamed through (never buffered whole), the headers that cross are an allowlist in each
direction, and the response head is bounded. Above all the caller's credentials never
cross: the daemon never sees an API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from pathlib import Path
from urllib.parse import urlencode

import h11

from ringfence.errors import InvalidRequest, SandboxError, SandboxNotRunning, TooManyRequests

__all__ = [
    "FORWARDED_REQUEST_HEADERS",
    "FORWARDED_REQUEST_PREFIX",
    "FORWARDED_RESPONSE_HEADERS",
    "DaemonClient",
    "DaemonResponse",
]

# What a client may tell the daemon: the Connect protocol's own headers, the body's type,
# when an upload is committed (``ringfence-commit: at-end``, sandboxd/_filehttp.py), and
# (any header named ``FORWARDED_REQUEST_PREFIX...``) an upload's file metadata, as envd.
FORWARDED_REQUEST_HEADERS = frozenset(
    {
        "content-type",
        "content-encoding",
        "ringfence-commit",
        "connect-protocol-version",
        "connect-timeout-ms",
        "connect-content-encoding",
        "connect-accept-encoding",
        "keepalive-ping-interval",
    }
)
FORWARDED_REQUEST_PREFIX = "x-metadata-"
FORWARDED_RESPONSE_HEADERS = frozenset({"content-type"})

_CONNECT_SECONDS = 10.0  # a live daemon accepts at once; one that takes longer is stuck
_HEAD_SECONDS = 60.0  # from the request's end to the answer's head (bodies may idle longer)
_WRITE_SECONDS = 60.0  # a daemon that stops reading a request body for this long is stuck
_MAX_REQUESTS = 256  # requests in flight to one daemon (each holds a socket on both sides)
_MAX_HEAD_BYTES = 64 * 1024
_IDLE_CONNECTIONS = 8
_CHUNK = 64 * 1024


class DaemonResponse:
    """An answer whose body streams: read it with ``aiter_raw`` or ``aread``, then
    ``aclose`` (which also runs when the body is read to its end)."""

    def __init__(
        self,
        client: DaemonClient,
        connection: _Connection,
        response: h11.Response,
    ) -> None:
        self.status_code = response.status_code
        self.headers = [
            (name.decode(), value.decode("latin-1")) for name, value in response.headers
        ]
        # The daemon's Content-Length, only when it is what framed the body (h11 then holds
        # the daemon to it): never beside a chunked body, never on a bodiless status.
        self.content_length: str | None = None
        if response.status_code not in (204, 304) and not any(
            name == "transfer-encoding" for name, _ in self.headers
        ):
            self.content_length = next(
                (value for name, value in self.headers if name == "content-length"), None
            )
        self._client = client
        self._connection: _Connection | None = connection

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come (chunked framing removed). What arrived together
        is passed on together: one write to the client instead of one per envelope."""
        connection = self._connection
        if connection is None:
            return
        pending: list[bytes] = []
        try:
            while True:
                try:
                    event = connection.protocol.next_event()
                    if event is h11.NEED_DATA:
                        if pending:
                            yield b"".join(pending)
                            pending.clear()
                        await connection.receive()
                        continue
                except (OSError, h11.ProtocolError) as exc:
                    raise _gone(self._client, str(exc)) from exc
                if isinstance(event, h11.Data):
                    pending.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    if pending:
                        yield b"".join(pending)
                    self._release(reusable=True)
                    return
                else:  # ConnectionClosed before the end
                    raise _gone(self._client, "it closed the connection mid-answer")
        finally:
            self._release(reusable=False)

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        self._release(reusable=False)

    def _release(self, reusable: bool) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._client._put_back(connection, reusable)


class DaemonClient:
    """Requests to one sandbox's daemon. ``aclose`` when the sandbox ends."""

    def __init__(
        self,
        sandbox_id: str,
        socket_path: Path,
        *,
        head_seconds: float = _HEAD_SECONDS,
        write_seconds: float = _WRITE_SECONDS,
        max_requests: int = _MAX_REQUESTS,
    ) -> None:
        """``head_seconds``: from a request's end to its answer's head; ``write_seconds``: a
        daemon that stops reading a request for this long is stuck; ``max_requests``: in
        flight at once."""
        self.sandbox_id = sandbox_id
        self._socket_path = str(socket_path)
        self._head_seconds = head_seconds
        self._write_seconds = write_seconds
        self._max_requests = max_requests
        self._idle: list[_Connection] = []
        self._closed = False
        self._in_flight = 0
        self._initializing: asyncio.Task[None] | None = None

    @property
    def socket_path(self) -> str:
        """Where the daemon listens (its port tunnels open their own connections there)."""
        return self._socket_path

    async def health(self, timeout: float) -> None:
        """Wait until the daemon answers (the first request waits in the backlog while
        the daemon starts).

        Raises:
            SandboxNotRunning: it did not answer within ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout):
                response = await self.send("GET", "/health")
                await response.aread()
        except TimeoutError:
            raise SandboxNotRunning(
                f"sandbox {self.sandbox_id}: its daemon did not answer within {timeout:g} s"
            ) from None
        if response.status_code != 204:
            raise SandboxNotRunning(
                f"sandbox {self.sandbox_id}: its daemon answered /health with "
                f"HTTP {response.status_code}"
            )

    def start_init(self, env: Mapping[str, str]) -> asyncio.Task[None]:
        """``init`` in the background: every later request waits for it first (and fails
        as it did), so nothing runs in the sandbox before its environment is set."""
        self._initializing = asyncio.create_task(self.init(env))
        return self._initializing

    async def initialized(self) -> None:
        """Wait for a ``start_init`` under way (at once when there is none, or it is done).

        Raises:
            SandboxNotRunning: it failed (the claim that started it kills the sandbox).
        """
        if self._initializing is not None:
            await asyncio.shield(self._initializing)

    async def init(self, env: Mapping[str, str]) -> None:
        """Set the environment every later process of the sandbox starts with.

        Raises:
            SandboxNotRunning: the daemon cannot be reached or refused.
        """
        body = json.dumps({"envVars": dict(env)}).encode()
        response = await self._send(
            "POST", "/init", headers={"content-type": "application/json"}, content=body
        )
        await response.aread()
        if response.status_code != 204:
            raise SandboxNotRunning(
                f"sandbox {self.sandbox_id}: its daemon refused /init (HTTP {response.status_code})"
            )

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        content: AsyncIterable[bytes] | bytes | None = None,
    ) -> DaemonResponse:
        """Send a request (a streamed body goes chunked); return once the answer's head is
        in. Only ``FORWARDED_REQUEST_HEADERS`` (and ``FORWARDED_REQUEST_PREFIX...``) of
        ``headers`` are sent. Waits for a
        ``start_init`` under way first.

        Raises:
            SandboxNotRunning: the daemon cannot be reached (the sandbox has ended), or its
                init failed.
            SandboxError: it is reached but gives no answer within a minute.
            InvalidRequest: a header cannot be sent as HTTP/1.1.
        """
        await self.initialized()
        return await self._send(method, path, params=params, headers=headers, content=content)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        content: AsyncIterable[bytes] | bytes | None = None,
    ) -> DaemonResponse:
        target = path + ("?" + urlencode(params) if params else "")
        kept = [
            (name, value)
            for name, value in (headers or {}).items()
            if name.lower() in FORWARDED_REQUEST_HEADERS
            or name.lower().startswith(FORWARDED_REQUEST_PREFIX)
        ]
        kept.append(("host", "sandbox"))
        if isinstance(content, bytes):
            kept.append(("content-length", str(len(content))))
        elif content is not None:
            kept.append(("transfer-encoding", "chunked"))
        elif method not in ("GET", "HEAD"):
            kept.append(("content-length", "0"))
        if self._in_flight >= self._max_requests:
            raise TooManyRequests(
                f"sandbox {self.sandbox_id} has {self._max_requests} requests in flight; "
                "wait for some to end"
            )
        connection = await self._connection()
        self._in_flight += 1
        connection.on_close = self._ended
        sent = False
        try:
            head = h11.Request(method=method, target=target, headers=kept)
            if isinstance(content, bytes):  # one write: the daemon wakes once, not twice
                whole = [head, h11.Data(data=content)] if content else [head]
                await connection.send(*whole, h11.EndOfMessage())
            else:
                await connection.send(head)
                if content is not None:
                    async for chunk in content:
                        if chunk:
                            await connection.send(h11.Data(data=chunk))
                await connection.send(h11.EndOfMessage())
            sent = True
            event = await connection.next_event(timeout=self._head_seconds)
            if isinstance(event, h11.InformationalResponse):  # one 100 Continue at most
                event = await connection.next_event(timeout=self._head_seconds)
        except h11.LocalProtocolError as exc:
            connection.close()
            raise InvalidRequest(f"the request cannot be passed to the sandbox: {exc}") from exc
        except TimeoutError as exc:
            connection.close()
            if not sent:  # it stopped reading the request: a daemon that is gone or wedged
                raise _gone(self, "it stopped reading the request") from exc
            # It took the whole request and is stuck on it: still running, not "not running".
            raise SandboxError(
                f"sandbox {self.sandbox_id}: its daemon did not answer within "
                f"{self._head_seconds:g} s (the sandbox still runs)"
            ) from exc
        except (OSError, h11.ProtocolError) as exc:
            connection.close()
            raise _gone(self, str(exc) or type(exc).__name__) from exc
        except BaseException:
            connection.close()
            raise
        if not isinstance(event, h11.Response):
            connection.close()
            raise _gone(self, f"it did not answer ({type(event).__name__})")
        if not 200 <= event.status_code <= 599:
            connection.close()
            raise _gone(self, f"it answered with status {event.status_code}")
        return DaemonResponse(self, connection, event)

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable():
                return connection
            connection.close()
        try:
            async with asyncio.timeout(_CONNECT_SECONDS):
                reader, writer = await asyncio.open_unix_connection(
                    self._socket_path, limit=_MAX_HEAD_BYTES
                )
        except (OSError, TimeoutError) as exc:
            raise _gone(self, str(exc) or "timed out connecting") from exc
        return _Connection(reader, writer, self._write_seconds)

    def _put_back(self, connection: _Connection, reusable: bool) -> None:
        self._ended(connection)
        if reusable and not self._closed and len(self._idle) < _IDLE_CONNECTIONS:
            with contextlib.suppress(h11.LocalProtocolError):
                connection.protocol.start_next_cycle()
                self._idle.append(connection)
                return
        connection.close()

    def _ended(self, connection: _Connection) -> None:
        """A request on ``connection`` is over (answered, failed or abandoned)."""
        if connection.on_close is not None:
            connection.on_close = None
            self._in_flight -= 1


class _Connection:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, write_seconds: float
    ) -> None:
        self.reader = reader
        self.writer = writer
        self._write_seconds = write_seconds
        self.protocol = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD_BYTES)
        self.on_close: Callable[[_Connection], None] | None = None  # while a request is on it

    async def send(self, *events: h11.Event) -> None:
        """Send ``events`` in one write. Raises ``TimeoutError`` when the daemon stops
        reading for ``write_seconds``."""
        data = b"".join(self.protocol.send(event) or b"" for event in events)
        if data:
            self.writer.write(data)
            async with asyncio.timeout(self._write_seconds):
                await self.writer.drain()

    async def next_event(self, timeout: float | None) -> h11.Event:
        """The next protocol event; ``ConnectionClosed`` at EOF.

        Raises:
            h11.RemoteProtocolError: the daemon broke HTTP.
            TimeoutError: nothing within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while True:
                event = self.protocol.next_event()
                if event is h11.NEED_DATA:
                    await self.receive()
                    continue
                assert isinstance(event, h11.Event)
                return event

    async def receive(self) -> None:
        """Feed what the socket has (at EOF, the end) to the protocol."""
        self.protocol.receive_data(await self.reader.read(_CHUNK))

    def usable(self) -> bool:
        return (
            self.protocol.our_state is h11.IDLE
            and self.protocol.their_state is h11.IDLE
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close(self)
        self.writer.close()


def _gone(client: DaemonClient, why: str) -> SandboxNotRunning:
    return SandboxNotRunning(
        f"sandbox {client.sandbox_id} is not running (its daemon cannot be reached: {why})"
    )
