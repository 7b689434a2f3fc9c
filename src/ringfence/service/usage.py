"""What sandboxes use (their metrics): read from the runtime when asked, never sampled
for a sandbox nobody asks about.

``now`` reads one sandbox (``LiveSandbox.usage``: its cgroup and volume). Its CPU use in
percent needs two readings: the previous one of the same sandbox when it is recent
(``RECENT_SECONDS``), else a second one ``WINDOW_SECONDS`` after the first. ``history``
(E2B's ``get_metrics(start, end)``) also *watches* the sandbox: it is then sampled every
``SAMPLE_SECONDS`` by one task of the server, for ``WATCH_SECONDS`` after the last ask,
into a bounded list of samples; nothing else is ever sampled. ``totals`` reads every
running sandbox once, for the Prometheus endpoint: server-wide sums and counts of
sandboxes by how much of their limits they use, a fixed set of series whatever the number
of sandboxes or tenants (no sandbox's or tenant's name appears in them).

Reading a paused sandbox never resumes it, and is no request to it (``auto_pause`` does
not count it): a sandbox watched by a dashboard still pauses when idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from ringfence.backends import LiveSandbox, Usage
from ringfence.errors import BackendUnavailable, SandboxNotRunning
from ringfence.models import SandboxMetrics

__all__ = ["BUCKETS", "SandboxUsage", "UsageSource", "UsageTotals"]

log = logging.getLogger(__name__)

SAMPLE_SECONDS = 5.0  # a watched sandbox is sampled this often (E2B's own cadence)
WATCH_SECONDS = 600.0  # and watched this long after the last ask for its history
WINDOW_SECONDS = 0.25  # CPU % with no recent reading: measured over this window
RECENT_SECONDS = 10.0  # a reading younger than this measures CPU % since it
TOTALS_SECONDS = 1.0  # a server-wide reading is reused this long
MAX_TRACKED = 10_000  # readings remembered (sandboxes); the oldest unwatched go first
# Fractions of a limit by which ``totals`` counts sandboxes (each count is cumulative).
BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0)


class UsageSource(Protocol):
    """Where the sandboxes are found (``SandboxService``)."""

    async def running_live(self, tenant: str, sandbox_id: str) -> LiveSandbox:
        """A sandbox running here (frozen or not), never resumed. Raises
        ``SandboxNotFound``, ``SandboxNotRunning``."""
        ...

    def running_sandboxes(self) -> list[tuple[str, str, LiveSandbox]]:
        """(tenant, sandbox id, handle) of every sandbox running here, frozen ones too."""
        ...


@dataclass(frozen=True, slots=True)
class _Sample:
    """One reading, kept as it came (a watched sandbox's history holds these: cheaper
    than the API's model, made only when asked)."""

    at: datetime
    usage: Usage
    percent: float


@dataclass
class _Track:
    """The last reading of one sandbox, and its samples while watched."""

    tenant: str
    at: float  # the monotonic clock
    cpu_seconds: float
    percent: float
    watched_until: float = 0.0
    samples: deque[_Sample] = field(
        default_factory=lambda: deque(maxlen=int(WATCH_SECONDS / SAMPLE_SECONDS) + 1)
    )


@dataclass(frozen=True)
class UsageTotals:
    """Every running sandbox at one instant (the Prometheus series)."""

    sandboxes: int  # measured
    unmeasured: int  # running, but their backend cannot be read
    cpu_cores: float  # cores in use now (over the time since the previous ``totals``)
    memory_bytes: int
    disk_bytes: int
    pids: int
    # Per fraction of ``BUCKETS``: how many sandboxes use at most that much of the limit.
    cpu_use: tuple[int, ...]
    memory_use: tuple[int, ...]
    disk_use: tuple[int, ...]


class SandboxUsage:
    """The metrics of the sandboxes of one server (see the module docstring)."""

    def __init__(self, source: UsageSource, *, sample_seconds: float = SAMPLE_SECONDS) -> None:
        self._source = source
        self._sample_seconds = sample_seconds
        self._tracks: dict[str, _Track] = {}
        self._sampler: asyncio.Task[None] | None = None
        self._scraped: dict[str, tuple[float, float]] = {}  # id -> (at, cpu) at ``totals``
        self._totals_lock = asyncio.Lock()
        self._last_totals: tuple[float, UsageTotals] | None = None  # (monotonic, reading)

    async def now(self, tenant: str, sandbox_id: str) -> SandboxMetrics:
        """One sample of a running sandbox, now.

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
            SandboxNotRunning: it has ended, or is paused to disk.
            BackendUnavailable: its backend cannot measure it.
        """
        return _metrics(sandbox_id, await self._read(tenant, sandbox_id))

    async def _read(self, tenant: str, sandbox_id: str) -> _Sample:
        live = await self._source.running_live(tenant, sandbox_id)
        return await self._measure(tenant, sandbox_id, live)

    async def history(
        self, tenant: str, sandbox_id: str, start: datetime | None, end: datetime | None
    ) -> list[SandboxMetrics]:
        """The samples of the sandbox between ``start`` and ``end`` (None: unbounded),
        oldest first, with one taken now; from now on it is watched (sampled every
        ``SAMPLE_SECONDS``) for ``WATCH_SECONDS``, so a later call sees more. Raises as
        ``now``."""
        sample = await self._read(tenant, sandbox_id)
        track = self._tracks.get(sandbox_id)
        if track is None:  # forgotten meanwhile (it ended)
            raise SandboxNotRunning(f"sandbox {sandbox_id} has ended")
        if not track.samples or track.samples[-1].at < sample.at:
            track.samples.append(sample)
        track.watched_until = time.monotonic() + WATCH_SECONDS
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.create_task(self._sample_watched())
        return [
            _metrics(sandbox_id, s)
            for s in track.samples
            if (start is None or s.at >= start) and (end is None or s.at <= end)
        ]

    async def totals(self) -> UsageTotals:
        """Every running sandbox read once (frozen ones too); one that cannot be read is
        counted as unmeasured. CPU use is over the time since the previous reading (0 for
        a sandbox new since then). The endpoint that asks needs no key, so a reading is
        reused for ``TOTALS_SECONDS`` and concurrent callers share one: scraping it in a
        loop costs one reading a second, whatever the rate."""
        async with self._totals_lock:
            last = self._last_totals
            if last is not None and time.monotonic() - last[0] < TOTALS_SECONDS:
                return last[1]
            totals = await self._read_totals()
            self._last_totals = (time.monotonic(), totals)
            return totals

    async def _read_totals(self) -> UsageTotals:
        running = self._source.running_sandboxes()
        readings = [await _reading(live) for _, _, live in running]  # one after another:
        at = time.monotonic()  # a local read awaits nothing, and a task each costs more
        scraped: dict[str, tuple[float, float]] = {}
        measured: list[tuple[Usage, float]] = []  # usage, its CPU share of its limit
        unmeasured = 0
        cores = 0.0
        for (_, sandbox_id, _), reading in zip(running, readings, strict=True):
            if isinstance(reading, SandboxNotRunning | BackendUnavailable):
                unmeasured += isinstance(reading, BackendUnavailable)
                continue
            if isinstance(reading, BaseException):
                log.warning("could not read the usage of sandbox %s: %r", sandbox_id, reading)
                unmeasured += 1
                continue
            scraped[sandbox_id] = (at, reading.cpu_seconds)
            used = 0.0
            before = self._scraped.get(sandbox_id)
            if before is not None and at > before[0] and reading.cpu_seconds >= before[1]:
                used = (reading.cpu_seconds - before[1]) / (at - before[0])
            cores += used
            measured.append((reading, used / (reading.cpus or _host_cores())))
        self._scraped = scraped
        self._forget_except(set(scraped) | {i for _, i, _ in running})
        return UsageTotals(
            sandboxes=len(measured),
            unmeasured=unmeasured,
            cpu_cores=cores,
            memory_bytes=sum(u.memory_bytes for u, _ in measured),
            disk_bytes=sum(u.disk_bytes for u, _ in measured),
            pids=sum(u.pids for u, _ in measured),
            cpu_use=_counts(share for _, share in measured),
            memory_use=_counts(_share(u.memory_bytes, u.memory_limit) for u, _ in measured),
            disk_use=_counts(_share(u.disk_bytes, u.disk_limit) for u, _ in measured),
        )

    async def aclose(self) -> None:
        """Stop sampling."""
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler

    async def _measure(self, tenant: str, sandbox_id: str, live: LiveSandbox) -> _Sample:
        usage = await live.usage()
        at = time.monotonic()
        track = self._tracks.get(sandbox_id)
        fresh = (
            track is not None
            and track.tenant == tenant
            and usage.cpu_seconds >= track.cpu_seconds  # a resumed sandbox counts anew
            and at - track.at <= RECENT_SECONDS
        )
        if track is not None and fresh:
            if at - track.at >= WINDOW_SECONDS:
                track.percent = _percent(track.cpu_seconds, track.at, usage, at)
                track.at, track.cpu_seconds = at, usage.cpu_seconds
            percent = track.percent
        else:
            await asyncio.sleep(WINDOW_SECONDS)
            later = await live.usage()
            later_at = time.monotonic()
            percent = _percent(usage.cpu_seconds, at, later, later_at)
            usage, at = later, later_at
            if track is None or track.tenant != tenant:
                self._remember(sandbox_id, _Track(tenant, at, usage.cpu_seconds, percent))
            else:
                track.at, track.cpu_seconds, track.percent = at, usage.cpu_seconds, percent
        return _Sample(datetime.now(UTC), usage, percent)

    def _remember(self, sandbox_id: str, track: _Track) -> None:
        if len(self._tracks) >= MAX_TRACKED:
            now = time.monotonic()
            idle = sorted((t.at, i) for i, t in self._tracks.items() if t.watched_until <= now)
            for _, oldest in idle[: max(1, len(idle) // 10)]:
                del self._tracks[oldest]
        self._tracks[sandbox_id] = track

    def _forget_except(self, running: set[str]) -> None:
        for sandbox_id in [i for i in self._tracks if i not in running]:
            del self._tracks[sandbox_id]

    async def _sample_watched(self) -> None:
        """Sample every watched sandbox each ``SAMPLE_SECONDS``; end when none is."""
        while True:
            await asyncio.sleep(self._sample_seconds)
            now = time.monotonic()
            running = {i: (t, live) for t, i, live in self._source.running_sandboxes()}
            self._forget_except(set(running))
            watched = [
                (i, t) for i, t in self._tracks.items() if t.watched_until > now and i in running
            ]
            if not watched:
                return
            for sandbox_id, track in watched:  # one after another, as ``totals`` reads
                await self._sample(sandbox_id, track, running[sandbox_id][1])

    async def _sample(self, sandbox_id: str, track: _Track, live: LiveSandbox) -> None:
        try:
            sample = await self._measure(track.tenant, sandbox_id, live)
        except (SandboxNotRunning, BackendUnavailable):
            return
        except Exception:  # boundary: one sandbox's failure never stops the others' samples
            log.exception("could not sample sandbox %s", sandbox_id)
            return
        track.samples.append(sample)


def _percent(cpu_before: float, at_before: float, usage: Usage, at: float) -> float:
    """CPU use between two readings in percent of the sandbox's limit (0 to 100)."""
    if at <= at_before:
        return 0.0
    cores = (usage.cpu_seconds - cpu_before) / (at - at_before)
    return round(min(100.0, max(0.0, 100.0 * cores / (usage.cpus or _host_cores()))), 2)


def _host_cores() -> float:
    """A sandbox without a CPU limit may use every core of the host."""
    return float(os.cpu_count() or 1)


def _share(used: int, limit: int) -> float:
    return used / limit if limit > 0 else 0.0


def _counts(shares: Iterable[float]) -> tuple[int, ...]:
    values = list(shares)
    return tuple(sum(v <= bound for v in values) for bound in BUCKETS)


async def _reading(live: LiveSandbox) -> Usage | BaseException:
    try:
        return await live.usage()
    except Exception as exc:  # boundary: ``totals`` counts it unmeasured and goes on
        return exc


def _metrics(sandbox_id: str, sample: _Sample) -> SandboxMetrics:
    usage, percent = sample.usage, sample.percent
    return SandboxMetrics(
        sandbox_id=sandbox_id,
        timestamp=sample.at,
        cpu_seconds=round(usage.cpu_seconds, 6),
        cpu_percent=percent,
        cpus=usage.cpus,
        memory_bytes=usage.memory_bytes,
        memory_cache_bytes=usage.memory_cache_bytes,
        memory_limit=usage.memory_limit,
        disk_bytes=usage.disk_bytes,
        disk_limit=usage.disk_limit,
        pids=usage.pids,
    )
