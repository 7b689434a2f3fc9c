"""``SandboxUsage``: CPU percent from two readings, the history of watched sandboxes
only, and the server-wide totals with a fixed set of buckets. The sandboxes here are
scripted handles (``usage`` only): the readings themselves are tested on real sandboxes
(tests/server/test_sandbox_metrics.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from ringfence.backends import Usage
from ringfence.errors import BackendUnavailable, SandboxNotFound, SandboxNotRunning
from ringfence.service import usage as usage_module
from ringfence.service.usage import BUCKETS, SandboxUsage

MIB = 1 << 20


@dataclass
class Scripted:
    """A running sandbox whose CPU time grows at ``cores`` per second of the clock."""

    cores: float = 0.0
    memory: int = 10 * MIB
    limit: int = 100 * MIB
    reads: int = 0
    started: float = field(default_factory=time.monotonic)
    unmeasured: bool = False

    async def usage(self) -> Usage:
        if self.unmeasured:
            raise BackendUnavailable("cannot")
        self.reads += 1
        cpu = self.cores * (time.monotonic() - self.started)
        return Usage(cpu_seconds=cpu, cpus=1.0, memory_bytes=self.memory, memory_limit=self.limit,
                     disk_bytes=MIB, disk_limit=4 * MIB, pids=3)  # fmt: skip


class Source:
    def __init__(self, **sandboxes: Scripted) -> None:
        self.sandboxes: dict[str, Scripted] = dict(sandboxes)

    async def running_live(self, tenant: str, sandbox_id: str) -> Any:
        if tenant != "acme":
            raise SandboxNotFound(f"no sandbox with id {sandbox_id!r}")
        if sandbox_id not in self.sandboxes:
            raise SandboxNotRunning("ended")
        return self.sandboxes[sandbox_id]

    def running_sandboxes(self) -> list[tuple[str, str, Any]]:
        return [("acme", i, s) for i, s in self.sandboxes.items()]


async def test_a_busy_sandbox_shows_its_share_and_an_idle_one_none() -> None:
    source = Source(busy=Scripted(cores=0.5), idle=Scripted())
    usage = SandboxUsage(source)  # type: ignore[arg-type]
    busy = await usage.now("acme", "busy")
    assert 40 <= busy.cpu_percent <= 60, busy
    assert (await usage.now("acme", "idle")).cpu_percent == 0
    assert busy.memory_bytes == 10 * MIB and busy.pids == 3
    reads = source.sandboxes["busy"].reads
    await usage.now("acme", "busy")  # a recent reading: no new window, one read
    assert source.sandboxes["busy"].reads == reads + 1
    with pytest.raises(SandboxNotFound):
        await usage.now("globex", "busy")


async def test_only_sandboxes_asked_for_their_history_are_sampled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(usage_module, "WINDOW_SECONDS", 0.01)
    source = Source(watched=Scripted(), other=Scripted())
    usage = SandboxUsage(source, sample_seconds=0.02)  # type: ignore[arg-type]
    try:
        first = await usage.history("acme", "watched", None, None)
        assert len(first) == 1
        deadline = time.monotonic() + 10
        while len(await usage.history("acme", "watched", None, None)) < 5:
            assert time.monotonic() < deadline, "the watched sandbox was not sampled"
            await asyncio.sleep(0.02)
        assert source.sandboxes["other"].reads == 0, "nobody asked about it"
        samples = await usage.history("acme", "watched", None, None)
        cut = samples[2].timestamp
        assert all(s.timestamp >= cut for s in await usage.history("acme", "watched", cut, None))
        del source.sandboxes["watched"]  # it ended: the sampler stops, nothing is kept
        await asyncio.wait_for(asyncio.shield(usage._sampler), 10)  # type: ignore[arg-type]
        assert usage._tracks == {}
    finally:
        await usage.aclose()


async def test_totals_count_sandboxes_by_their_share_of_each_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = Source(
        small=Scripted(memory=10 * MIB),  # 0.1 of its limit
        half=Scripted(memory=50 * MIB),
        full=Scripted(memory=100 * MIB, cores=0.9),
        blind=Scripted(unmeasured=True),
    )
    usage = SandboxUsage(source)  # type: ignore[arg-type]
    first = await usage.totals()
    assert (first.sandboxes, first.unmeasured) == (3, 1)
    assert first.memory_bytes == 160 * MIB and first.pids == 9 and first.disk_bytes == 3 * MIB
    assert first.cpu_cores == 0, "no earlier scrape to measure from"
    by_memory = dict(zip(BUCKETS, first.memory_use, strict=True))
    assert by_memory == {0.25: 1, 0.5: 2, 0.75: 2, 0.9: 2, 1.0: 3}
    assert all(count == 3 for count in first.disk_use)  # a quarter of each disk
    await asyncio.sleep(0.2)
    reads = source.sandboxes["full"].reads
    assert await usage.totals() is first, "reused within a second: a scrape loop is cheap"
    assert source.sandboxes["full"].reads == reads
    monkeypatch.setattr(usage_module, "TOTALS_SECONDS", 0.0)
    second = await usage.totals()
    assert 0.6 <= second.cpu_cores <= 1.2, second
    by_cpu = dict(zip(BUCKETS, second.cpu_use, strict=True))
    assert by_cpu[0.75] == 2 and by_cpu[1.0] == 3, "the busy one uses over 0.75 of its core"
