"""Reaching a server a sandbox runs on one of its ports: preview URLs (docs/design.md 14.2).

The sandbox gains no inbound network: each connection is a tunnel through its daemon
(``port_tunnel``), which connects to the port on the sandbox's own loopback. This module
decides who may open one:

- a key of the sandbox's tenant, or its traffic access token (which names the tenant and
  key it was handed to): another tenant's is ``SandboxNotFound``, as for any sandbox;
- anyone, when the sandbox was created with ``public_traffic``; without it an anonymous
  caller is told a token or key is needed, whether or not the sandbox exists (no oracle);
- never a port Ringfence itself listens on inside the sandbox (the egress proxy and
  resolver: through them a caller would act with the sandbox's egress policy, its
  injected credentials included).

It bounds the tunnels open at once per sandbox and audits each route: the first connection
of each (sandbox, port, actor) is recorded, then again at the 10th, 100th, 1000th... with
the count, so the record names everyone who reached a port without growing by a line per
request (a page load is dozens).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ringfence.errors import (
    Forbidden,
    InvalidRequest,
    SandboxNotFound,
    TooManyRequests,
    Unauthenticated,
)
from ringfence.models import Sandbox
from ringfence.network.gateway import DNS_PORT, PROXY_PORT
from ringfence.sandboxd.browser import AGENT_PORT, CDP_PORT
from ringfence.sandboxd.methods import GROUP_PORT
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.port_tunnel import Pipe, open_tunnel

__all__ = ["RESERVED_PORTS", "Admitted", "PortCaller", "Ports", "Tunnel"]

# Ports Ringfence listens on inside a sandbox: with a network, its egress proxy and
# resolver (network/gateway.py); in a group, the group relay (service/groups.py); with a
# browser, its agent and Chromium's DevTools (sandboxd/browser: reached only through the
# browser routes, whose callers are never anonymous).
RESERVED_PORTS = frozenset({PROXY_PORT, DNS_PORT, GROUP_PORT, AGENT_PORT, CDP_PORT})
_KEPT = 4096  # sandboxes whose facts and counts are kept before ended ones are forgotten
_COUNTED = 65_536  # (sandbox, port, actor) routes counted for the audit record at most


class Sandboxes(Protocol):
    """What ports need of the sandbox service (``SandboxService`` is one)."""

    async def get(self, tenant: str, sandbox_id: str) -> Sandbox: ...

    async def daemon(self, tenant: str, sandbox_id: str) -> DaemonClient: ...

    def live_tenant(self, sandbox_id: str) -> str | None: ...

    def touch(self, sandbox_id: str) -> None: ...

    def record(
        self,
        tenant: str,
        actor: str,
        action: str,
        sandbox_id: str,
        outcome: str = "ok",
        details: Mapping[str, object] | None = None,
    ) -> None: ...


@dataclass(frozen=True)
class PortCaller:
    """Who opens a port: the tenant (None: an anonymous caller), the actor the audit
    record names (a key id, ``public`` for an anonymous caller, ``sandbox:ID`` for a peer)
    and how it was admitted (``key``, ``token``, ``public``, ``group``). A peer's
    ``group``: only sandboxes of its tenant in that group are found for it."""

    tenant: str | None
    actor: str
    access: str
    group: str | None = None

    @classmethod
    def anonymous(cls) -> PortCaller:
        return cls(None, "public", "public")


@dataclass(frozen=True)
class _Facts:
    """What a sandbox's record says about its ports (fixed at create)."""

    tenant: str
    public: bool
    group: str | None


class Tunnel:
    """An open connection to a sandbox's port; ``aclose`` it (it counts until then).
    Relays call ``active`` as bytes pass: traffic is a request, for ``auto_pause``."""

    def __init__(
        self, pipe: Pipe, on_close: Callable[[], None], on_activity: Callable[[], None]
    ) -> None:
        self.reader = pipe.reader
        self.writer = pipe.writer
        self._pipe = pipe
        self._on_close: Callable[[], None] | None = on_close
        self._on_activity = on_activity

    def active(self) -> None:
        """Note traffic (a dictionary lookup: cheap enough for every chunk)."""
        self._on_activity()

    async def aclose(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
            await self._pipe.aclose()

    def discard(self) -> None:
        """Close it without waiting for the close to complete."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
            self.writer.close()


@dataclass(frozen=True)
class Admitted:
    """A caller admitted to a sandbox's port (its sandbox awake): ``Ports.connect`` opens
    tunnels for it."""

    tenant: str
    sandbox_id: str
    port: int
    daemon: DaemonClient
    anonymous: bool = False  # its tunnels count in the anonymous share too


class Ports:
    """Opens tunnels to sandboxes' ports for callers the rules above admit."""

    def __init__(self, sandboxes: Sandboxes, max_per_sandbox: int) -> None:
        self._sandboxes = sandboxes
        self._max = max_per_sandbox
        self._facts: dict[str, _Facts] = {}
        self._open: collections.Counter[str] = collections.Counter()
        # Anonymous callers hold at most this many of a sandbox's tunnels: the rest are
        # kept for its key, token and group callers (review 2a #3: visitors of a public
        # sandbox holding slow answers locked its owner out of its own ports).
        self._anonymous_share = max(1, max_per_sandbox * 3 // 4)
        self._open_anonymous: collections.Counter[str] = collections.Counter()
        # Connections counted for the audit record, least recently used first: per route
        # (sandbox, port, actor), but per (sandbox, "public", 0) for anonymous callers,
        # with a bitmap of the distinct ports they reached (review 2a #4).
        self._opened: collections.OrderedDict[tuple[str, int, str], int] = collections.OrderedDict()
        self._anonymous_ports: dict[str, bytearray] = {}  # 8 KiB per public sandbox reached
        self._anonymous_distinct: collections.Counter[str] = collections.Counter()

    def open_count(self, sandbox_id: str) -> int:
        return self._open[sandbox_id]

    @property
    def max_per_sandbox(self) -> int:
        return self._max

    def has_room(self, admitted: Admitted) -> bool:
        """Whether ``connect`` would open a tunnel for ``admitted`` now (not past the
        sandbox's bound, nor, for an anonymous caller, past the anonymous share)."""
        sandbox_id = admitted.sandbox_id
        if self._open[sandbox_id] >= self._max:
            return False
        return not admitted.anonymous or self._open_anonymous[sandbox_id] < self._anonymous_share

    async def open(self, caller: PortCaller, sandbox_id: str, port: int, *, via: str) -> Tunnel:
        """``admit``, then ``connect``: a tunnel to ``port`` of the sandbox. Raises what
        both raise."""
        return await self.connect(await self.admit(caller, sandbox_id, port, via=via))

    async def admit(self, caller: PortCaller, sandbox_id: str, port: int, *, via: str) -> Admitted:
        """Admit ``caller`` to ``port`` of the sandbox (resumed first if paused, as by any
        request), on the audit record. ``via`` names the route there (``path``, ``host``).

        Raises:
            InvalidRequest: the port is not from 1 to 65535.
            Forbidden: the port is one Ringfence listens on inside the sandbox.
            Unauthenticated: an anonymous caller, and the sandbox is not public (or is
                not known here).
            SandboxNotFound: no such sandbox in the caller's tenant.
            SandboxNotRunning: it has ended (or is paused with auto_resume off).
        """
        if not 0 < port < 65536:
            raise InvalidRequest(f"port {port} is not from 1 to 65535")
        if port in RESERVED_PORTS:
            raise Forbidden(
                f"port {port} is Ringfence's own inside the sandbox (its egress proxy, "
                f"resolver, group relay and browser listen on {sorted(RESERVED_PORTS)}): it "
                "is never reached from outside (the browser: through its own routes)"
            )
        facts = await self._facts_for(caller, sandbox_id)
        daemon = await self._sandboxes.daemon(facts.tenant, sandbox_id)
        self._audit(facts.tenant, caller, sandbox_id, port, via)
        return Admitted(facts.tenant, sandbox_id, port, daemon, anonymous=caller.tenant is None)

    async def admit_browser(self, caller: PortCaller, sandbox_id: str) -> Admitted:
        """Admit ``caller`` to the sandbox's Chromium DevTools port (``CDP_PORT``), which
        ``admit`` refuses: only a key of the sandbox's tenant or its traffic token, never
        an anonymous caller (not even of a ``public_traffic`` sandbox) nor a peer of its
        group. A CDP client owns the browser (its cookies, every page): it is as powerful
        as code in the sandbox. Its caller records what came of it (``record_cdp_open``).

        Raises:
            Unauthenticated: an anonymous caller, whether or not the sandbox exists.
            SandboxNotFound: no such sandbox in the caller's tenant (or a group peer).
            SandboxNotRunning: it has ended (or is paused with auto_resume off).
        """
        if caller.tenant is None:
            raise Unauthenticated(
                f"the browser of sandbox {sandbox_id} is reached with an API key of its "
                "tenant or its traffic access token (E2B-Traffic-Access-Token), never "
                "anonymously, public_traffic or not"
            )
        if caller.access not in ("key", "token"):
            raise SandboxNotFound(f"no sandbox {sandbox_id}")
        facts = await self._facts_for(caller, sandbox_id)
        daemon = await self._sandboxes.daemon(facts.tenant, sandbox_id)
        return Admitted(facts.tenant, sandbox_id, CDP_PORT, daemon)

    def record_cdp_open(
        self, caller: PortCaller, admitted: Admitted, error: str | None = None
    ) -> None:
        """Put an admitted CDP WebSocket on the audit record as ``browser.cdp_open``, once
        what came of it is known: ok once it is open, failed with ``error`` (an error code)
        when it was refused after its admission (each time: CDP connections are few)."""
        details: dict[str, object] = {"access": caller.access}
        if error is not None:
            details["error"] = error
        self._sandboxes.record(
            admitted.tenant, caller.actor, "browser.cdp_open", admitted.sandbox_id,
            "ok" if error is None else "failed", details,
        )  # fmt: skip

    async def connect(self, admitted: Admitted) -> Tunnel:
        """A new tunnel for an admitted caller.

        Raises:
            TooManyRequests: the sandbox has its most tunnels open (or, for an anonymous
                caller, its anonymous share of them).
            PortNotListening: nothing listens on the port.
            SandboxNotRunning, SandboxError, Forbidden: as ``port_tunnel.open_tunnel``.
        """
        sandbox_id, anonymous = admitted.sandbox_id, admitted.anonymous
        if self._open[sandbox_id] >= self._max:
            raise TooManyRequests(
                f"sandbox {sandbox_id} has {self._max} connections to its ports open; "
                "wait for some to end"
            )
        if anonymous and self._open_anonymous[sandbox_id] >= self._anonymous_share:
            raise TooManyRequests(
                f"sandbox {sandbox_id} has {self._anonymous_share} anonymous connections to "
                "its ports open (the rest are kept for its own callers); wait for some to end"
            )
        self._open[sandbox_id] += 1
        self._open_anonymous[sandbox_id] += anonymous
        try:
            pipe = await open_tunnel(admitted.daemon.socket_path, sandbox_id, admitted.port)
        except BaseException:
            self._closed(sandbox_id, anonymous)
            raise
        return Tunnel(
            pipe, lambda: self._closed(sandbox_id, anonymous),
            lambda: self._sandboxes.touch(sandbox_id),
        )  # fmt: skip

    async def _facts_for(self, caller: PortCaller, sandbox_id: str) -> _Facts:
        tenant = caller.tenant
        if tenant is None:  # anonymous: the sandbox must be known here, and public
            known = self._facts.get(sandbox_id)
            tenant = known.tenant if known is not None else self._sandboxes.live_tenant(sandbox_id)
            if tenant is None:
                raise _needs_credentials(sandbox_id)
        facts = self._facts.get(sandbox_id)
        if facts is None or facts.tenant != tenant:
            sandbox = await self._sandboxes.get(tenant, sandbox_id)  # SandboxNotFound
            facts = _Facts(tenant, sandbox.public_traffic, sandbox.group)
            self._remember(sandbox_id, facts)
        if caller.tenant is None and not facts.public:
            raise _needs_credentials(sandbox_id)
        if caller.access == "group" and (caller.group is None or facts.group != caller.group):
            raise SandboxNotFound(f"no sandbox {sandbox_id} in group {caller.group}")
        return facts

    def _remember(self, sandbox_id: str, facts: _Facts) -> None:
        if len(self._facts) >= _KEPT:
            for known in [s for s in self._facts if self._sandboxes.live_tenant(s) is None]:
                del self._facts[known]
            for key in [k for k in self._opened if k[0] not in self._facts]:
                del self._opened[key]
                self._forget_anonymous(key[0])
        self._facts[sandbox_id] = facts

    def _audit(self, tenant: str, caller: PortCaller, sandbox_id: str, port: int, via: str) -> None:
        """Record a route's first connection and every power of ten of them. Anonymous
        callers are one route per sandbox (a scan of its ports is not a record per port),
        recorded also at each power of ten of the distinct ports reached. The counts are
        bounded: past ``_COUNTED`` the least recently used is forgotten (its next
        connection is recorded again, from 1), never all at once."""
        anonymous = caller.tenant is None
        key = (sandbox_id, 0 if anonymous else port, caller.actor)
        if key in self._opened:
            self._opened.move_to_end(key)
        else:
            while len(self._opened) >= _COUNTED:
                forgotten, _ = self._opened.popitem(last=False)
                if forgotten[1] == 0:
                    self._forget_anonymous(forgotten[0])
            self._opened[key] = 0
        self._opened[key] += 1
        count = self._opened[key]
        details: dict[str, object] = {
            "port": port, "via": via, "access": caller.access, "connections": count,
        }  # fmt: skip
        new_port = False
        if anonymous:
            seen = self._anonymous_ports.setdefault(sandbox_id, bytearray(65536 // 8))
            byte, bit = divmod(port, 8)
            if not seen[byte] & (1 << bit):
                seen[byte] |= 1 << bit
                self._anonymous_distinct[sandbox_id] += 1
                distinct = self._anonymous_distinct[sandbox_id]
                new_port = distinct > 1 and _power_of_ten(distinct)
            details["ports"] = self._anonymous_distinct[sandbox_id]
        if count == 1 or _power_of_ten(count) or new_port:
            self._sandboxes.record(tenant, caller.actor, "sandbox.port_open", sandbox_id,
                                   details=details)  # fmt: skip

    def _forget_anonymous(self, sandbox_id: str) -> None:
        self._anonymous_ports.pop(sandbox_id, None)
        self._anonymous_distinct.pop(sandbox_id, None)

    def _closed(self, sandbox_id: str, anonymous: bool) -> None:
        for counts in (self._open, self._open_anonymous) if anonymous else (self._open,):
            counts[sandbox_id] -= 1
            if counts[sandbox_id] <= 0:
                del counts[sandbox_id]


def _power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


def _needs_credentials(sandbox_id: str) -> Unauthenticated:
    return Unauthenticated(
        f"reaching a port of sandbox {sandbox_id} needs its traffic access token "
        "(E2B-Traffic-Access-Token) or an API key of its tenant, unless it was created "
        "with public_traffic"
    )
