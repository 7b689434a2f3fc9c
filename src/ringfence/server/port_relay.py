"""One request, or one WebSocket, relayed over a tunnel to a sandbox's port.

HTTP: h11 speaks HTTP/1.1 to the sandbox's server over the tunnel, the request body
streamed to it as it comes and the answer streamed back as it comes (server-sent events,
downloads); one tunnel per request. WebSocket: wsproto opens the sandbox server's
WebSocket, and messages are relayed both ways between it and the ASGI WebSocket, close
codes included.

What crosses is filtered in both directions by the caller (``headers``); here only
hop-by-hop headers are dropped and framing is redone. Everything the sandbox answers is
untrusted: its head is bounded, a broken answer ends the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable, Iterator

import h11
from starlette.types import Receive, Scope, Send
from wsproto import ConnectionType, WSConnection
from wsproto import events as ws

from ringfence.errors import TooManyRequests
from ringfence.service.ports import Tunnel

__all__ = ["HOP_BY_HOP", "Broken", "WebSocketSlots", "fetch", "relay_http", "relay_websocket"]

Headers = list[tuple[bytes, bytes]]

# RFC 9110 7.6.1: meaningful for one connection only, never relayed.
HOP_BY_HOP = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate",
        b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade",
        b"expect",
    }
)  # fmt: skip
_MAX_HEAD = 64 * 1024
_CHUNK = 64 * 1024
_MAX_MESSAGE = 1024 * 1024  # a WebSocket message from the sandbox, reassembled (UTF-8 bytes)
_HEAD_SECONDS = 60.0  # from the request's end to its answer's head, as the daemon's calls


class Broken(Exception):
    """The sandbox's server broke HTTP or closed before answering (nothing was sent yet)."""


class WebSocketSlots:
    """The WebSockets relayed at once across the server, bounded so that together they
    hold at most about ``limit`` times twice ``message`` bytes (each reassembles one message
    at a time: review 2a #2). A relay whose messages may be larger than ``message`` takes
    as many slots as it weighs (``weight``), so the bound on memory holds whatever relays.

    The browsers' CDP relays (``browser=True``) together take at most ``browser_limit``
    slots: a quarter of them (at least one, on a server of two or more) is kept for
    preview URLs' WebSockets, which CDP sessions, however many and however idle, never
    take (review 3 #3)."""

    def __init__(self, limit: int, message: int) -> None:
        self.limit = limit
        self.message = message
        self.browser_limit = limit - max(1, limit // 4) if limit > 1 else limit
        self._taken = 0
        self._browser_taken = 0

    @property
    def taken(self) -> int:
        """Slots held now."""
        return self._taken

    @property
    def browser_taken(self) -> int:
        """Slots the browsers' CDP relays hold now (within ``taken``)."""
        return self._browser_taken

    def weight(self, max_message: int, *, browser: bool = False) -> int:
        """The slots a relay of messages up to ``max_message`` bytes takes (at least 1, at
        most all it may take: one such relay is always served on an idle server)."""
        most = self.browser_limit if browser else self.limit
        return max(1, min(most, math.ceil(max_message / self.message)))

    @contextlib.contextmanager
    def held(self, max_message: int, *, browser: bool = False) -> Iterator[None]:
        """Hold the slots of one relay (a browser's CDP relay: ``browser``) while the block
        runs.

        Raises:
            TooManyRequests: not enough of them are free (for a browser's: of its share).
        """
        weight = self.weight(max_message, browser=browser)
        if self._taken + weight > self.limit:
            raise TooManyRequests(
                f"the server relays {self.limit} WebSockets' worth of messages at once "
                f"(this one counts {weight}); retry later"
            )
        if browser and self._browser_taken + weight > self.browser_limit:
            raise TooManyRequests(
                f"browsers' CDP WebSockets take at most {self.browser_limit} of the server's "
                f"{self.limit} relayed WebSockets' worth (max_relayed_websockets; the rest is "
                f"kept for preview URLs), and this one counts {weight}; retry later"
            )
        self._taken += weight
        self._browser_taken += weight if browser else 0
        try:
            yield
        finally:
            self._taken -= weight
            self._browser_taken -= weight if browser else 0


def _strip(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    return [(n.lower(), v) for n, v in headers if n.lower() not in HOP_BY_HOP]


async def relay_http(
    scope: Scope,
    receive: Receive,
    send: Send,
    tunnel: Tunnel,
    *,
    target: bytes,
    headers: Headers,
    answer_headers: Headers,
    answer_filter: Callable[[Headers], Headers] | None = None,
    connection: h11.Connection | None = None,
) -> h11.Connection | None:
    """Relay the request (``target``, ``headers`` as they go to the sandbox) and its answer
    (with ``answer_headers`` added, its headers passed through ``answer_filter``), on
    ``connection`` (a kept-alive one of ``tunnel``'s) or a new one. Returns the connection,
    ready for a next request, when the sandbox's server keeps it alive; else None.

    Raises:
        Broken: nothing usable came back (before anything was sent to the client).
    """
    sandbox = connection or h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
    sent, has_body = _framed(headers)
    writer = tunnel.writer
    try:
        writer.write(sandbox.send(h11.Request(method=scope["method"], target=target, headers=sent)))
    except h11.LocalProtocolError as exc:
        raise Broken(f"the request cannot be passed on: {exc}") from exc
    answered = asyncio.Event()
    pump = asyncio.create_task(_pump_body(receive, sandbox, tunnel, has_body, answered))
    try:
        response = await _head(sandbox, tunnel)
        kept = _strip(response.headers)
        kept = answer_filter(kept) if answer_filter is not None else kept
        if any(n == b"transfer-encoding" for n, _ in response.headers):
            # h11 read it chunked (RFC 9112 6.3); its Content-Length would frame the
            # client's answer wrong (and make the ASGI server fail it mid-answer)
            kept = [(n, v) for n, v in kept if n != b"content-length"]
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": kept + answer_headers,
            }
        )
        while True:
            event = await _next(sandbox, tunnel, None)
            if isinstance(event, h11.Data):
                tunnel.active()
                await send(
                    {"type": "http.response.body", "body": bytes(event.data), "more_body": True}
                )
            elif isinstance(event, h11.EndOfMessage):
                answered.set()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return _reusable(sandbox, tunnel)
            else:  # closed mid-answer: the client must not take it for the whole answer
                raise ConnectionError("the sandbox's server closed the connection mid-answer")
    finally:
        answered.set()
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump


def _framed(headers: Headers) -> tuple[Headers, bool]:
    """The request's headers as they go to the sandbox, with exactly one framing header,
    and whether it has a body. A chunked request (the client's ASGI server decoded the
    chunks) goes on chunked, its Content-Length dropped (RFC 9112 6.3: with both, chunked
    wins and an intermediary must remove Content-Length; passing both lets a server that
    reads Content-Length first take part of the body for a next request)."""
    sent = _strip(headers)
    chunked = any(n.lower() == b"transfer-encoding" for n, _ in headers)
    if chunked:
        sent = [(n, v) for n, v in sent if n != b"content-length"]
        sent.append((b"transfer-encoding", b"chunked"))
    return sent, chunked or any(n == b"content-length" for n, _ in sent)


def _reusable(sandbox: h11.Connection, tunnel: Tunnel) -> h11.Connection | None:
    """``sandbox`` ready for a next request, if both sides are done with this one and the
    sandbox's server sent nothing beyond its answer (which would be taken for the next)."""
    if sandbox.our_state is not h11.DONE or sandbox.their_state is not h11.DONE:
        return None
    if sandbox.trailing_data[0] or tunnel.reader.at_eof():
        return None
    try:
        sandbox.start_next_cycle()
    except h11.LocalProtocolError:
        return None
    return sandbox


async def _pump_body(
    receive: Receive,
    sandbox: h11.Connection,
    tunnel: Tunnel,
    has_body: bool,
    answered: asyncio.Event,
) -> None:
    """The request body to the sandbox as it comes; then wait for the client to leave:
    leaving before the answer is whole closes the tunnel (so a stream nobody reads ends)."""
    try:
        if has_body:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ConnectionResetError
                chunk = message.get("body", b"")
                if chunk:
                    tunnel.writer.write(sandbox.send(h11.Data(data=chunk)))
                    await tunnel.writer.drain()
                if not message.get("more_body", False):
                    break
        tunnel.writer.write(sandbox.send(h11.EndOfMessage()))
        await tunnel.writer.drain()
        while (await receive())["type"] != "http.disconnect":
            pass
    except (OSError, h11.LocalProtocolError):
        pass
    if not answered.is_set():
        tunnel.writer.close()


async def fetch(
    tunnel: Tunnel, *, target: bytes, headers: Headers, max_body: int
) -> tuple[int, bytes]:
    """``GET target`` on ``tunnel`` (``headers`` as they go), buffered: the answer's status
    and body. For the server's own small questions to a sandbox's server, never a client's.

    Raises:
        Broken: nothing usable came back, or a body over ``max_body`` bytes.
    """
    sandbox = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
    sent = [(n, v) for n, v in _strip(headers) if n != b"content-length"]
    try:
        tunnel.writer.write(sandbox.send(h11.Request(method="GET", target=target, headers=sent)))
        tunnel.writer.write(sandbox.send(h11.EndOfMessage()))
        await tunnel.writer.drain()
    except (OSError, h11.LocalProtocolError) as exc:
        raise Broken(f"the request cannot be passed on: {exc}") from exc
    response = await _head(sandbox, tunnel)
    body = bytearray()
    try:
        while True:
            event = await _next(sandbox, tunnel, _HEAD_SECONDS)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > max_body:
                    raise Broken(f"the sandbox's server answered more than {max_body} bytes")
            elif isinstance(event, h11.EndOfMessage):
                return response.status_code, bytes(body)
            else:
                raise Broken("the sandbox's server closed the connection mid-answer")
    except (TimeoutError, OSError, h11.RemoteProtocolError) as exc:
        raise Broken(f"the sandbox's server broke HTTP: {exc}") from exc


async def _head(sandbox: h11.Connection, tunnel: Tunnel) -> h11.Response:
    while True:
        try:
            event = await _next(sandbox, tunnel, _HEAD_SECONDS)
        except TimeoutError as exc:
            raise Broken("the sandbox's server did not answer within 60 s") from exc
        except (OSError, h11.RemoteProtocolError) as exc:
            raise Broken(f"the sandbox's server broke HTTP: {exc}") from exc
        if isinstance(event, h11.Response):
            return event
        if not isinstance(event, h11.InformationalResponse):  # 1xx: the ASGI server's job
            raise Broken("the sandbox's server closed the connection without answering")


async def _next(sandbox: h11.Connection, tunnel: Tunnel, timeout: float | None) -> h11.Event:
    async with asyncio.timeout(timeout):
        while True:
            event = sandbox.next_event()
            if event is h11.NEED_DATA:
                sandbox.receive_data(await tunnel.reader.read(_CHUNK))
                continue
            if event is h11.PAUSED:
                raise h11.RemoteProtocolError("the sandbox's server answered more than asked")
            assert isinstance(event, h11.Event)
            return event


async def relay_websocket(
    scope: Scope,
    receive: Receive,
    send: Send,
    tunnel: Tunnel,
    *,
    host: str,
    target: str,
    headers: Headers,
    max_message: int = _MAX_MESSAGE,
    accepted: Callable[[], None] | None = None,
    refused: Callable[[int], None] | None = None,
) -> None:
    """Open the sandbox server's WebSocket at ``target`` and relay messages both ways
    until either side closes. A refusal by the sandbox's server is passed back as its
    status (the ASGI server's 403 when it cannot send a response), and told to
    ``refused``; ``accepted`` is called once the client's WebSocket is accepted. A message
    from the sandbox larger than ``max_message`` bytes (UTF-8 for text) closes the
    WebSocket with 1009; one is held at most once whole plus its fragments (about twice
    that).

    Raises:
        Broken: the sandbox's server broke the handshake.
    """
    connection = WSConnection(ConnectionType.CLIENT)
    subprotocols = [str(p) for p in scope.get("subprotocols", [])]
    extra = [(n, v) for n, v in _strip(headers) if not n.startswith(b"sec-websocket-")]
    extra = [(n, v) for n, v in extra if n != b"host"]
    tunnel.writer.write(
        connection.send(ws.Request(host=host, target=target, subprotocols=subprotocols,
                                   extra_headers=extra))
    )  # fmt: skip
    answer = await _handshake(connection, tunnel)
    if isinstance(answer, ws.RejectConnection):
        if refused is not None:
            refused(answer.status_code)
        await _refuse(scope, send, answer.status_code)
        return
    await send({"type": "websocket.accept", "subprotocol": answer.subprotocol})
    if accepted is not None:
        accepted()
    upstream = asyncio.create_task(_from_sandbox(connection, tunnel, send, max_message))
    try:
        await _to_sandbox(connection, tunnel, receive, upstream)
    finally:
        upstream.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await upstream


async def _handshake(
    connection: WSConnection, tunnel: Tunnel
) -> ws.AcceptConnection | ws.RejectConnection:
    async with asyncio.timeout(_HEAD_SECONDS):
        while True:
            data = await tunnel.reader.read(_CHUNK)
            if not data:
                raise Broken("the sandbox's server closed the connection during the handshake")
            try:
                connection.receive_data(data)
                for event in connection.events():
                    if isinstance(event, ws.AcceptConnection | ws.RejectConnection):
                        return event
            except Exception as exc:  # wsproto's RemoteProtocolError and its kin
                raise Broken(f"the sandbox's server broke the WebSocket handshake: {exc}") from exc


async def _refuse(scope: Scope, send: Send, status: int) -> None:
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": []})
        await send({"type": "websocket.http.response.body", "body": b""})
    else:
        await send({"type": "websocket.close", "code": 1008})


async def _to_sandbox(
    connection: WSConnection, tunnel: Tunnel, receive: Receive, upstream: asyncio.Task[None]
) -> None:
    """The client's messages to the sandbox until the client leaves or the sandbox's side
    ends (then the client is left to the ASGI server, already told)."""
    while True:
        getting = asyncio.ensure_future(receive())
        done, _ = await asyncio.wait({getting, upstream}, return_when=asyncio.FIRST_COMPLETED)
        if getting not in done:
            getting.cancel()
            return
        message = getting.result()
        tunnel.active()
        try:
            if message["type"] == "websocket.receive":
                if message.get("text") is not None:
                    data = connection.send(ws.TextMessage(data=message["text"]))
                else:
                    data = connection.send(ws.BytesMessage(data=message.get("bytes") or b""))
                tunnel.writer.write(data)
                await tunnel.writer.drain()
            elif message["type"] == "websocket.disconnect":
                code = message.get("code", 1000)
                code = code if 1000 <= code < 5000 and code not in (1005, 1006, 1015) else 1000
                with contextlib.suppress(Exception):
                    tunnel.writer.write(connection.send(ws.CloseConnection(code=code)))
                    await tunnel.writer.drain()
                return
        except (OSError, ConnectionError):
            return
        except Exception:  # wsproto: the connection is closing; nothing more to send
            return


async def _from_sandbox(
    connection: WSConnection, tunnel: Tunnel, send: Send, max_message: int
) -> None:
    """The sandbox's messages to the client, each reassembled as UTF-8 bytes (text counted
    as what it weighs on the wire, not in characters: an emoji is one character of four
    bytes, and as a str four bytes a character too) and decoded once whole."""
    message = bytearray()
    try:
        while True:
            data = await tunnel.reader.read(_CHUNK)
            if not data:
                await send({"type": "websocket.close", "code": 1001})  # it went away
                return
            tunnel.active()
            connection.receive_data(data)
            for event in connection.events():
                if isinstance(event, ws.TextMessage | ws.BytesMessage):
                    part = event.data.encode() if isinstance(event.data, str) else event.data
                    if len(message) + len(part) > max_message:
                        await send({"type": "websocket.close", "code": 1009})
                        return
                    message += part
                    del part
                    if event.message_finished:
                        whole = bytes(message)
                        message = bytearray()
                        if isinstance(event, ws.TextMessage):
                            await send({"type": "websocket.send", "text": whole.decode()})
                        else:
                            await send({"type": "websocket.send", "bytes": whole})
                        del whole
                elif isinstance(event, ws.Ping):
                    tunnel.writer.write(connection.send(event.response()))
                elif isinstance(event, ws.CloseConnection):
                    with contextlib.suppress(Exception):
                        tunnel.writer.write(connection.send(event.response()))
                    code = event.code if 1000 <= event.code < 5000 and event.code not in (
                        1005, 1006, 1015) else 1000  # fmt: skip
                    await send(
                        {"type": "websocket.close", "code": code, "reason": event.reason or ""}
                    )
                    return
    except (OSError, ConnectionError):
        with contextlib.suppress(Exception):
            await send({"type": "websocket.close", "code": 1011})
    except Exception:  # wsproto: the sandbox's server broke the protocol
        with contextlib.suppress(Exception):
            await send({"type": "websocket.close", "code": 1002})
