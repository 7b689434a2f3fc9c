"""How the proxy and the sandbox resolver learn a name's addresses: a fixed table first
(operators' and tests' own names), then, if enabled, the host's resolver.

Lookups through the host's resolver block a thread each (``getaddrinfo``). They run on the
resolver's own pool, never the event loop's default executor, and each sandbox may have only
a few in flight: a sandbox asking for names that never answer holds its own few threads, not
every other sandbox's lookups (or the rest of the server's blocking work).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ringfence.policy.egress import Address, normalize_host

__all__ = ["LOOKUPS_PER_SANDBOX", "Resolver", "ResolverBusy"]

_TIMEOUT_SECONDS = 5.0
LOOKUPS_PER_SANDBOX = 4  # host lookups in flight per owner (sandbox); more wait, then fail
_THREADS = 64  # the pool every host lookup runs on (threads start as needed)
_Infos = list[tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]]


class ResolverBusy(Exception):
    """The owner already has its lookups in flight, and none ended within the timeout."""


class Resolver:
    def __init__(
        self, hosts: Mapping[str, Sequence[str]] | None = None, *, system: bool = True
    ) -> None:
        """``hosts``: names answered from this table, never asked upstream. ``system``:
        other names go to the host's resolver (getaddrinfo); False answers nothing else."""
        self._hosts = {
            normalize_host(name): tuple(ipaddress.ip_address(a) for a in addresses)
            for name, addresses in (hosts or {}).items()
        }
        self._system = system
        self._pool: ThreadPoolExecutor | None = None
        self._slots: weakref.WeakKeyDictionary[object, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    async def resolve(self, host: str, owner: object | None = None) -> list[Address]:
        """The addresses of ``host`` (itself for an IP literal); empty when unknown.
        ``owner`` (a sandbox's session): whose lookups in flight are counted and capped.

        Raises:
            ResolverBusy: ``owner`` has ``LOOKUPS_PER_SANDBOX`` host lookups in flight, and
                none ended within the lookup timeout.
        """
        host = normalize_host(host)
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            pass
        if host in self._hosts:
            return list(self._hosts[host])
        if not self._system:
            return []
        slot = self._slot(owner)
        try:
            await asyncio.wait_for(slot.acquire(), _TIMEOUT_SECONDS)
        except TimeoutError:
            raise ResolverBusy(f"{LOOKUPS_PER_SANDBOX} lookups already in flight") from None
        try:
            lookup = self._submit(host)
        except BaseException:
            slot.release()
            raise
        loop = asyncio.get_running_loop()

        def done(_: Future[_Infos]) -> None:
            # The slot is free when the thread is, not when the caller stops waiting.
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(slot.release)

        lookup.add_done_callback(done)
        try:
            infos = await asyncio.wait_for(asyncio.wrap_future(lookup), _TIMEOUT_SECONDS)
        except (OSError, TimeoutError, UnicodeError):
            return []
        found: list[Address] = []
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                found.append(ipaddress.ip_address(str(sockaddr[0]).partition("%")[0]))
        return list(dict.fromkeys(found))

    def _slot(self, owner: object | None) -> asyncio.Semaphore:
        key = owner if owner is not None else self
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = asyncio.Semaphore(LOOKUPS_PER_SANDBOX)
        return slot

    def _submit(self, host: str) -> Future[_Infos]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="ringfence-resolver")
        return self._pool.submit(_lookup, host)


def _lookup(host: str) -> _Infos:
    # socket.getaddrinfo is looked up at each call (tests replace it).
    return list(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
