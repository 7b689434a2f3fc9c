"""The warm pool: per template, sandboxes started ahead of time, handed out in milliseconds.

A pooled sandbox is started with its template's limits (``limits_for``: the defaults unless
the template has its own, as the browser template does), no network (a ``networked``
template's: an egress policy allowing nothing, its session keyed by a placeholder), no
environment of anyone's and a long idle deadline. Its daemon is checked healthy, then its
template's ``prepare`` (if any: the browser template's starts the browser agent and its
Chromium) runs, bounded; only then does it join the pool, so a claim never sees a
half-prepared sandbox. A start or a prepare that fails or overruns discards the sandbox, is
logged and is retried after ``_RETRY_SECONDS``. A create that asks for nothing the pool
cannot give (its template's limits; no network, or for a networked template a network
policy) claims one: it is then bound to its claimer (the environment and sandbox id through
the daemon's ``/init``, the timeout moved to the claimer's; a networked one's egress session
handed over to the claimer, with its policy, before the claim returns) and never goes back;
the pool refills in the background. No sandbox ever serves two claims, so nothing of one
claim can be seen by the next. A pooled sandbox that idles past ``_IDLE_SECONDS`` expires
and is replaced. When the server's totals have no room for a tenant's sandbox, idle pooled
ones are evicted first (``evict``): a tenant's request comes before a sandbox nobody asked
for yet.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field

from ringfence.backends import LaunchSpec, LiveSandbox, SandboxRuntime
from ringfence.config import Config
from ringfence.errors import RingfenceError, SandboxError
from ringfence.models import NetworkMode, NetworkPolicy, ResourceLimits, SandboxLimits
from ringfence.network.session import Requester, requesting
from ringfence.sandboxd.methods import PROCESS
from ringfence.service.budget import Budget, Reservation
from ringfence.service.daemon_client import DaemonClient

__all__ = ["DENY_ALL", "PoolStats", "Prepare", "Warm", "WarmPool"]

log = logging.getLogger(__name__)

_IDLE_SECONDS = 3600.0
# A networked template's pooled sandbox, until its claim: the proxy and resolver run, and
# refuse everything (an empty rule list allows nothing).
DENY_ALL = NetworkPolicy(mode=NetworkMode.RULES)
_HEALTH_SECONDS = 10.0
# A template's prepare (the browser's: its agent and Chromium, 2-5 s here when idle) gets
# this long; past it the sandbox is discarded like a failed start.
_PREPARE_SECONDS = 60.0
_RETRY_SECONDS = 5.0  # after a failed start, before the next attempt
# A claim's refill waits this long while the pool still holds some: starting a sandbox
# beside the claimer's first commands slowed them by half on a 2-core machine.
_REFILL_DELAY_SECONDS = 0.5


@dataclass
class Warm:
    """A ready sandbox, as claimed."""

    live: LiveSandbox
    daemon: DaemonClient
    # Its share of the server's totals (no tenant's: the claimer adds its own), or None
    # without a budget. The claimer's live entry gives it back at its end.
    reservation: Reservation | None = None
    # A networked template's (``networked``): the placeholder subject its egress session is
    # keyed by until a claimer takes it over (tenant ""); None: it has no network.
    egress_subject: str | None = None


@dataclass
class PoolStats:
    size: int = 0  # ready now
    target: int = 0
    hits: int = 0
    misses: int = 0


@dataclass
class _Template:
    target: int
    ready: collections.deque[Warm] = field(default_factory=collections.deque)
    stats: PoolStats = field(default_factory=PoolStats)
    wanted: asyncio.Event = field(default_factory=asyncio.Event)


Prepare = Callable[["Warm"], Awaitable[None]]


class WarmPool:
    def __init__(
        self,
        runtime: SandboxRuntime,
        config: Config,
        sizes: Mapping[str, int],
        image_for: Callable[[str], str],
        budget: Budget | None = None,
        *,
        limits_for: Callable[[str], SandboxLimits | None] = lambda _: None,
        prepare: Mapping[str, Prepare] | None = None,
        networked: Collection[str] = (),
    ) -> None:
        """``sizes``: template -> how many to keep ready (0 disables); ``image_for``: the
        root filesystem of a template; ``budget``: the server's, which every pooled sandbox
        counts in (None: not counted). ``limits_for``: a template's own limits, over the
        server's defaults (None: the defaults); a create of that template claims only if
        its limits resolve to the same. ``prepare``: template -> what runs in each of its
        sandboxes once its daemon is healthy, before it joins the pool (bounded by
        ``_PREPARE_SECONDS``; one that raises or overruns discards the sandbox).
        ``networked``: templates whose pooled sandboxes start with an egress policy that
        allows nothing (``DENY_ALL``), so that a create with a network policy can claim one
        and hand its egress session over (a browser's one-shot scrape must reach its page);
        a create without network then never claims one of them."""
        self._runtime = runtime
        self._config = config
        self._image_for = image_for
        self._budget = budget
        self._limits_for = limits_for
        self._prepare = dict(prepare or {})
        self._networked = frozenset(networked)
        self._templates = {name: _Template(size) for name, size in sizes.items() if size > 0}
        self._fillers: list[asyncio.Task[None]] = []
        self._watchers: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        if not self._fillers:
            self._fillers = [
                asyncio.create_task(self._fill(name, template))
                for name, template in self._templates.items()
            ]

    def limits(self, template: str) -> ResourceLimits:
        """The limits every pooled sandbox of ``template`` runs with."""
        own = self._limits_for(template)
        defaults = self._config.default_limits
        return defaults if own is None else own.merged_over(defaults)

    def networked(self, template: str) -> bool:
        """Whether ``template``'s pooled sandboxes have a (deny-all) egress policy."""
        return template in self._networked

    def claim(self, template: str) -> Warm | None:
        """A ready sandbox of ``template``, now (counted as a hit), or None (a miss)."""
        pool = self._templates.get(template)
        if pool is None:
            return None
        while pool.ready:
            warm = pool.ready.popleft()
            self._refill(pool)
            if warm.live.running:
                pool.stats.hits += 1
                return warm
            self._ended_idle(warm)  # its watcher leaves it to us
        pool.stats.misses += 1
        pool.wanted.set()
        return None

    async def evict(self) -> bool:
        """Kill one idle pooled sandbox and give its share of the server's totals back, for
        a tenant's create the server has no room for (a tenant's request comes before a
        sandbox nobody asked for yet). Whether there was one. The pool refills at its next
        claim or end, when the filler waits its turn for room like any other start."""
        pool = max(self._templates.values(), key=lambda p: len(p.ready), default=None)
        if pool is None or not pool.ready:
            return False
        warm = pool.ready.pop()
        await self._discard(warm)
        return True

    def _ended_idle(self, warm: Warm) -> None:
        """A pooled sandbox taken out of the pool that had ended meanwhile: its share and
        its daemon's connections go back (its watcher, finding it gone, leaves them)."""
        self._give_back(warm.reservation)
        closing = asyncio.create_task(warm.daemon.aclose())
        self._watchers.add(closing)
        closing.add_done_callback(self._watchers.discard)

    def _refill(self, pool: _Template) -> None:
        if not pool.ready:
            pool.wanted.set()  # empty: the next claim would miss, refill now
        elif self._fillers:
            asyncio.get_running_loop().call_later(_REFILL_DELAY_SECONDS, pool.wanted.set)

    def pass_over(self, template: str) -> None:
        """A create of ``template`` that the pool cannot serve (it asked for other limits):
        counted as a miss."""
        pool = self._templates.get(template)
        if pool is not None:
            pool.stats.misses += 1

    def stats(self) -> dict[str, PoolStats]:
        for pool in self._templates.values():
            pool.stats.size, pool.stats.target = len(pool.ready), pool.target
        return {name: pool.stats for name, pool in self._templates.items()}

    async def aclose(self) -> None:
        for filler in self._fillers:
            filler.cancel()
        for filler in self._fillers:
            with contextlib.suppress(asyncio.CancelledError):
                await filler
        self._fillers = []
        for watcher in self._watchers:
            watcher.cancel()
        idle = [warm for pool in self._templates.values() for warm in pool.ready]
        for pool in self._templates.values():
            pool.ready.clear()
        await asyncio.gather(*(self._discard(warm) for warm in idle), return_exceptions=True)

    async def _fill(self, name: str, pool: _Template) -> None:
        while True:
            if len(pool.ready) >= pool.target:
                pool.wanted.clear()
                await pool.wanted.wait()
                continue
            try:  # resolved at every start: a template built or rebuilt meanwhile is used
                warm = await self._start(name, self._image_for(name))
            except RingfenceError as exc:  # ServerAtCapacity, too: the pool waits its turn
                log.warning("could not start a pooled %s sandbox: %s", name, exc.message)
                await asyncio.sleep(_RETRY_SECONDS)
                continue
            pool.ready.append(warm)
            watcher = asyncio.create_task(self._forget_when_ended(pool, warm))
            self._watchers.add(watcher)
            watcher.add_done_callback(self._watchers.discard)

    async def _start(self, name: str, image: str) -> Warm:
        """A healthy, prepared sandbox of template ``name``.

        Raises ``ServerAtCapacity`` (no room in the server's totals), what the runtime's
        start raises, or ``SandboxError`` (the template's prepare failed or overran)."""
        limits = self.limits(name)
        reservation = None
        if self._budget is not None:
            reservation = self._budget.reserve(None, self._budget.amount(limits))
        network, subject = None, None
        if name in self._networked:  # keyed apart until its claimer takes it over
            network, subject = DENY_ALL, f"pooled:{secrets.token_hex(8)}"
        spec = LaunchSpec(
            image=image, env={}, limits=limits, timeout=_IDLE_SECONDS, network=network
        )
        try:
            with requesting(Requester(subject=subject or "")):
                live = await self._runtime.start(spec)
        except BaseException:
            self._give_back(reservation)
            raise
        warm = Warm(live, DaemonClient("pooled", live.socket_path), reservation, subject)
        try:
            await warm.daemon.health(_HEALTH_SECONDS)
            # The daemon loads its process service on first use: load it now, while idle,
            # rather than in the claimer's first command.
            listed = await warm.daemon.send(
                "POST",
                f"/{PROCESS}/List",
                headers={"content-type": "application/json"},
                content=b"{}",
            )
            await listed.aread()
            await self._prepared(name, warm)
        except BaseException:
            await self._discard(warm)
            raise
        return warm

    async def _prepared(self, name: str, warm: Warm) -> None:
        """Run template ``name``'s prepare in ``warm``, bounded.

        Raises:
            SandboxError: it raised (whatever it raised: a prepare is foreign code, and
                the sandbox it leaves half-prepared is discarded either way) or overran.
        """
        prepare = self._prepare.get(name)
        if prepare is None:
            return
        bound = asyncio.timeout(_PREPARE_SECONDS)
        try:
            async with bound:
                await prepare(warm)
        except Exception as exc:  # boundary: a prepare's failure discards its sandbox
            if bound.expired():
                raise SandboxError(
                    f"its {name} prepare took longer than {_PREPARE_SECONDS:g} s"
                ) from None
            message = exc.message if isinstance(exc, RingfenceError) else repr(exc)
            raise SandboxError(f"its {name} prepare failed: {message}") from exc

    async def _forget_when_ended(self, pool: _Template, warm: Warm) -> None:
        """An idle pooled sandbox that ends (its idle deadline) leaves the pool."""
        await warm.live.ended()
        try:
            pool.ready.remove(warm)
        except ValueError:
            return  # claimed (its new owner ends it), or taken ended (_ended_idle, evict)
        pool.wanted.set()
        self._give_back(warm.reservation)
        await warm.daemon.aclose()

    async def _discard(self, warm: Warm) -> None:
        await warm.live.kill()  # should it fail, the sandbox may live on: its share stays held
        self._give_back(warm.reservation)
        await warm.daemon.aclose()

    def _give_back(self, reservation: Reservation | None) -> None:
        if self._budget is not None and reservation is not None:
            self._budget.release(reservation)
