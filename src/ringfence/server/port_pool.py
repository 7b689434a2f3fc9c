"""Kept-alive connections to sandboxes' servers, between requests through preview URLs.

Opening a tunnel (a unix connection to the daemon, its loopback connect, the upgrade)
costs about half a millisecond; a page load is dozens of requests. So a tunnel whose last
answer left its HTTP connection reusable waits here for the next request of the same
request on the same client connection to the same port, as a reverse proxy keeps
upstream connections. Keyed by (sandbox, port, actor, client connection): a tunnel is only
ever reused by the next request on the client's own connection, never by another client's
(every anonymous visitor of a public sandbox is the actor "public", every holder of one
traffic token one actor; sharing by actor let one visitor's desynchronised connection
answer the next visitor, review 2a #1). Idle ones still count
against the sandbox's bound (``service.ports``), and are closed first when it is reached.
"""

from __future__ import annotations

import time

import h11

from ringfence.service.ports import Tunnel

__all__ = ["IdleTunnels"]

_IDLE_SECONDS = 15.0
_PER_KEY = 4
_MOST = 1024

Key = tuple[str, int, str, str]  # sandbox id, port, actor, client connection (address:port)


class IdleTunnels:
    """Idle tunnels with their HTTP connection state, newest last per key."""

    def __init__(self) -> None:
        self._idle: dict[Key, list[tuple[Tunnel, h11.Connection, float]]] = {}
        self._count = 0

    def take(self, key: Key) -> tuple[Tunnel, h11.Connection] | None:
        """A live idle tunnel for ``key``, or None; stale ones met on the way are closed
        (the caller awaits nothing: a closed tunnel's writer is closed at once)."""
        entries = self._idle.get(key)
        now = time.monotonic()
        while entries:
            tunnel, connection, since = entries.pop()
            self._count -= 1
            if now - since <= _IDLE_SECONDS and not tunnel.reader.at_eof():
                if not entries:
                    del self._idle[key]
                return tunnel, connection
            tunnel.discard()
        self._idle.pop(key, None)
        return None

    def put(self, key: Key, tunnel: Tunnel, connection: h11.Connection) -> None:
        entries = self._idle.setdefault(key, [])
        entries.append((tunnel, connection, time.monotonic()))
        self._count += 1
        while len(entries) > _PER_KEY:
            entries.pop(0)[0].discard()
            self._count -= 1
        if self._count > _MOST:
            self._sweep()

    def close_one(self, sandbox_id: str) -> bool:
        """Close an idle tunnel of the sandbox (its oldest of one key), to make room."""
        for key, entries in self._idle.items():
            if key[0] == sandbox_id and entries:
                entries.pop(0)[0].discard()
                self._count -= 1
                if not entries:
                    del self._idle[key]
                return True
        return False

    def _sweep(self) -> None:
        """Close the stale, then the oldest, until at most ``_MOST`` are idle."""
        now = time.monotonic()
        everything = sorted(
            ((since, key, i) for key, entries in self._idle.items()
             for i, (_, _, since) in enumerate(entries)),
        )  # fmt: skip
        doomed = {
            (key, i)
            for n, (since, key, i) in enumerate(everything)
            if now - since > _IDLE_SECONDS or n < len(everything) - _MOST
        }
        for key in list(self._idle):
            kept = []
            for i, entry in enumerate(self._idle[key]):
                if (key, i) in doomed:
                    entry[0].discard()
                else:
                    kept.append(entry)
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        self._count = sum(len(entries) for entries in self._idle.values())
