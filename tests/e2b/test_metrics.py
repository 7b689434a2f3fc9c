"""E2B's ``get_metrics`` through the unmodified SDK: real readings of the sandbox's
cgroup and volume, a history that grows once asked for, bounded by ``start``/``end``."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from e2b import AsyncSandbox, Sandbox, SandboxMetrics, SandboxNotFoundException
from tests.e2b.conftest import E2bServer

MIB = 1 << 20


def _until_busy(sbx: Sandbox) -> list[SandboxMetrics]:
    deadline = time.monotonic() + 20
    while True:
        samples = sbx.get_metrics()
        if samples[-1].cpu_used_pct >= 70 or time.monotonic() > deadline:
            return samples
        time.sleep(0.3)


def test_get_metrics_shows_cpu_memory_and_disk(e2b_server: E2bServer) -> None:
    with Sandbox.create(timeout=120) as sbx:
        first = sbx.get_metrics()
        assert len(first) == 1
        idle = first[0]
        assert idle.cpu_count >= 1 and idle.mem_total > 0 and idle.disk_total > 0
        assert abs(idle.timestamp - datetime.now(UTC)) < timedelta(seconds=30)
        sbx.commands.run("python3 -c 'while True: pass'", background=True)
        busy = _until_busy(sbx)
        assert busy[-1].cpu_used_pct >= 70, busy
        assert len(busy) >= 2, "asked once: its samples are kept"
        assert [s.timestamp for s in busy] == sorted(s.timestamp for s in busy)
        sbx.commands.run("pkill -f 'while True'")
        sbx.files.write("/home/user/blob.bin", b"\x03" * (16 * MIB))
        after = sbx.get_metrics()[-1]
        assert after.disk_used >= idle.disk_used + 16 * MIB
        assert after.mem_used >= 16 * MIB  # a tmpfs holds its files in memory
        later = datetime.now(UTC) + timedelta(hours=1)
        assert sbx.get_metrics(start=later) == []
        assert Sandbox.get_metrics(sbx.sandbox_id)  # the class form, by id
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics(sbx.sandbox_id)


def test_another_tenants_sandbox_is_not_found(e2b_server: E2bServer) -> None:
    with Sandbox.create(timeout=60) as sbx, pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics(sbx.sandbox_id, api_key=e2b_server.other_key)


async def test_the_async_sdk_reads_them_too(e2b_server: E2bServer) -> None:
    sbx = await AsyncSandbox.create(timeout=60)
    try:
        samples = await sbx.get_metrics()
        assert samples and samples[-1].mem_used > 0
    finally:
        await sbx.kill()
