"""Connections before authentication: bounded in time and in number.

uvicorn keeps a connection for as long as its client takes to send a request head, and an
idle one for its keep-alive (330 s here: E2B's SDKs keep idle connections for 300 s). So
1,500 connections without a key that trickled their heads stayed open for 70 s and grew the
server's descriptors without bound. ``protocol_class`` makes uvicorn's h11 protocol hold:

- **A head deadline.** A request head is complete within ``head_timeout`` seconds of the
  connection's opening, or of the first byte of a keep-alive connection's next request; else
  the connection is closed. Trickling a byte at a time does not move the deadline. Until the
  connection has authenticated, the deadline holds for the request's body too (the API reads
  a JSON body before it looks at the key): an unauthenticated request is whole in time.
- **Idle time before authentication.** Until a request on it has authenticated, a connection
  idles between requests for at most ``head_timeout``; afterwards for uvicorn's keep-alive.
- **Connections before authentication.** At most ``per_client`` connections of one client
  address (an IPv6 address by its /48, what one site is usually given: a /64 each would
  hand one site 65,536 caps) and ``in_all`` of all clients have not yet carried an
  authenticated request. One past its client's cap is closed as soon as it opens. One past
  ``in_all`` is admitted and the oldest unauthenticated connection of all is closed instead:
  every connection starts unauthenticated, keyed clients' too, so refusing newcomers would
  let a few addresses that hold the slots lock everyone out; evicting the oldest, a client
  that sends its request at once is served unless ``in_all`` connections open before its
  head arrives. Authenticated connections are not counted: a client with a key keeps the
  pool of connections its SDK wants.

What authenticates a request is the app's to say: the code that accepts a key or an access
token calls ``authenticated()``, which a context variable (set in the request's own task)
ties to the request's connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import ipaddress
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["authenticated", "client_of", "protocol_class"]


class _Unproven:
    """The connections of each client that have not authenticated, counted, oldest first."""

    def __init__(self, per_client: int, in_all: int) -> None:
        self.per_client = per_client
        self.in_all = in_all
        self.counts: collections.Counter[str] = collections.Counter()
        self.connections: dict[_Connection, None] = {}  # in the order they were admitted

    def admit(self, connection: _Connection, client: str) -> bool:
        """Count ``connection`` under ``client``, closing the oldest unauthenticated
        connection of all if ``in_all`` are counted; False (not counted) past ``client``'s
        cap."""
        if self.counts[client] >= self.per_client:
            return False
        while len(self.connections) >= self.in_all:
            next(iter(self.connections)).evict()
        self.counts[client] += 1
        self.connections[connection] = None
        return True

    def leave(self, connection: _Connection, client: str) -> None:
        del self.connections[connection]
        self.counts[client] -= 1
        if not self.counts[client]:
            del self.counts[client]


class _Connection:
    """What ``authenticated()`` reaches of a request's connection."""

    def __init__(
        self, unproven: _Unproven, on_proven: Callable[[], None], close: Callable[[], None]
    ) -> None:
        self._unproven = unproven
        self._on_proven = on_proven
        self._close = close
        self.client: str | None = None  # counted as unproven, under this client's name
        self.proven = False

    def counted(self, client: str) -> bool:
        if not self._unproven.admit(self, client):
            return False
        self.client = client
        return True

    def prove(self) -> None:
        if not self.proven:
            self.proven = True
            self.uncount()
            self._on_proven()

    def evict(self) -> None:
        """Close this connection to make room: uncounted at once, not when it is lost."""
        self.uncount()
        self._close()

    def uncount(self) -> None:
        if self.client is not None:
            self._unproven.leave(self, self.client)
            self.client = None


_CURRENT: contextvars.ContextVar[_Connection | None] = contextvars.ContextVar(
    "ringfence_connection", default=None
)


def authenticated() -> None:
    """Mark the current request's connection as authenticated (a key or an access token
    was accepted): it idles for the full keep-alive and no longer counts against its
    client's connections before authentication. Outside a request served by
    ``protocol_class``'s protocol (in-process tests, MCP in process), nothing happens."""
    connection = _CURRENT.get()
    if connection is not None:
        connection.prove()


def client_of(host: str) -> str:
    """The name a client's connections are counted under: its IP address, an IPv6 one by
    its /48 (an IPv4-mapped one as the IPv4 address)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 48), strict=False))
    return str(address)


def protocol_class(*, head_timeout: float, per_client: int, in_all: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol, holding to the bounds of this module's docstring (give it as
    ``uvicorn.Config(http=..., ws="wsproto")``: an upgraded connection leaves the counts,
    ``handle_websocket_upgrade``). Connections of one server share the counts."""
    unproven = _Unproven(per_client, in_all)

    class Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_deadline: asyncio.TimerHandle | None = None
            self._connection = _Connection(unproven, self._stop_head_deadline, self._evicted)
            app = self.app

            async def tied(scope: Any, receive: Any, send: Any) -> None:
                _CURRENT.set(self._connection)  # in the request's task: its own context
                await app(scope, receive, send)

            self.app = tied

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if not self._connection.counted(client_of(self.client[0] if self.client else "")):
                transport.abort()  # past the cap: closed before a byte is read
                return
            self._start_head_deadline()  # nothing sent yet is an incomplete head, too

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            keep_alive = self.timeout_keep_alive_task  # None: a pipelined request began
            if keep_alive is not None and not self._connection.proven:
                keep_alive.cancel()
                self.timeout_keep_alive_task = self.loop.call_later(
                    head_timeout, self.timeout_keep_alive_handler
                )
            if self.conn.trailing_data[0]:  # the start of a next head, already here
                self._watch_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_deadline()
            self._connection.uncount()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            """A WebSocket (only preview URLs serve one) leaves this protocol for
            uvicorn's WebSocket one: it leaves the counts and the head deadline here too.
            Its head is whole; the app answers it at once, refusing any caller it does not
            admit, so an upgraded connection never idles unauthenticated."""
            self._stop_head_deadline()
            self._connection.uncount()
            super().handle_websocket_upgrade(event)

        def _waiting(self) -> bool:
            """Whether the request is not whole yet, as far as the deadline cares: its head
            (bytes of it, or none yet), or its body before the connection authenticated."""
            state = self.conn.their_state
            return state is h11.IDLE or (state is h11.SEND_BODY and not self._connection.proven)

        def _evicted(self) -> None:
            self._stop_head_deadline()
            self.transport.abort()

        def _watch_head(self) -> None:
            if self.transport.is_closing() or not self._waiting():
                self._stop_head_deadline()
            elif self._head_deadline is None:
                self._start_head_deadline()

        def _start_head_deadline(self) -> None:
            self._head_deadline = self.loop.call_later(head_timeout, self._head_too_slow)

        def _stop_head_deadline(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_too_slow(self) -> None:
            self._head_deadline = None
            if self._waiting() and not self.transport.is_closing():
                self.transport.close()

    return Protocol
