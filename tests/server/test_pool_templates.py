"""The warm pool's per-template parts on real sandboxes: a template's own limits (the
browser template's, from ``Config``) and its ``prepare``, which a claim never sees unfinished
and whose failure never hands a sandbox out."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import struct
from collections.abc import AsyncIterator, Callable, Mapping

import pytest

from ringfence.backends import LiveSandbox
from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.config import Config
from ringfence.models import ResourceLimits, SandboxLimits, SandboxSpec
from ringfence.policy.limits import template_limits
from ringfence.service import pool as pool_module
from ringfence.service.budget import Budget
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.pool import Prepare, Warm, WarmPool
from ringfence.service.sandboxes import SandboxService, template_image
from ringfence.store import MemoryStore

# "base" plays the browser template here: the rule is by name, and "base" starts in a
# fraction of Chromium's time. 768 MiB and 512 pids differ from every general default.
_CONFIG = Config(browser_template="base", browser_memory=768 << 20, browser_pids=512)


@pytest.fixture
async def runtime(local_host: object) -> AsyncIterator[LocalSandboxRuntime]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    executor = LocalExecutor(_CONFIG, host=local_host)
    yield LocalSandboxRuntime(executor, _CONFIG)
    await executor.aclose()


def _pool(
    runtime: LocalSandboxRuntime,
    budget: Budget | None = None,
    *,
    limits_for: Callable[[str], SandboxLimits | None] = lambda name: template_limits(name, _CONFIG),
    prepare: Mapping[str, Prepare] | None = None,
) -> WarmPool:
    return WarmPool(
        runtime, _CONFIG, {"base": 1}, lambda name: template_image(name, _CONFIG), budget,
        limits_for=limits_for, prepare=prepare,
    )  # fmt: skip


async def _run(daemon: DaemonClient, script: str) -> str:
    """``script``'s standard output, run by ``sh`` through the sandbox's daemon."""
    body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", script]}}).encode()
    response = await daemon.send(
        "POST",
        "/process.Process/Start",
        headers={"content-type": "application/connect+json"},
        content=struct.pack(">BI", 0, len(body)) + body,
    )
    raw, out = await response.aread(), b""
    while raw:
        _, length = struct.unpack(">BI", raw[:5])
        data = json.loads(raw[5 : 5 + length]).get("event", {}).get("data", {})
        raw = raw[5 + length :]
        if "stdout" in data:
            out += base64.b64decode(data["stdout"])
    return out.decode()


_FORK_40 = """
import os, time
forked = 0
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
print(forked)
"""


# A connection to an address outside the sandbox (TEST-NET-1): ENETUNREACH (101) without a route.
_CONNECT_OUT = (
    'python3 -c \'import socket\ntry:\n socket.create_connection(("192.0.2.1", 80), 5)\n'
    ' print("connected")\nexcept OSError as e:\n print("unreachable" if e.errno == 101'
    " else repr(e))'"
)


async def _until(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def test_a_browser_create_with_default_limits_gets_the_browser_limits_from_the_pool(
    runtime: LocalSandboxRuntime,
) -> None:
    budget = Budget.for_server(_CONFIG)
    pool = _pool(runtime, budget)
    service = SandboxService(MemoryStore(), runtime, _CONFIG, pool=pool, budget=budget)
    service.start()
    try:
        await _until(lambda: service.pool_stats()["base"].size == 1, "the pool held one")
        sandbox = await service.create("acme", SandboxSpec(timeout=60))
        assert service.pool_stats()["base"].hits == 1, "default limits claim the pooled one"
        assert (sandbox.limits.memory, sandbox.limits.pids) == (768 << 20, 512)
        assert sandbox.limits.cpus == _CONFIG.default_limits.cpus  # the rest: the defaults
        usage = await service.usage.now("acme", sandbox.id)
        assert usage.memory_limit == 768 << 20, "the kernel holds the browser's memory limit"
        # Asking for the general defaults is asking for other limits: no claim.
        other = await service.create(
            "acme", SandboxSpec(limits=ResourceLimits(memory=_CONFIG.default_limits.memory))
        )
        assert other.limits.memory == _CONFIG.default_limits.memory
        assert other.limits.pids == 512, "the fields it leaves out are still the browser's"
        assert service.pool_stats()["base"].misses == 1
    finally:
        await service.aclose()


async def test_a_pooled_sandbox_runs_under_its_templates_limits(
    runtime: LocalSandboxRuntime,
) -> None:
    small = SandboxLimits(memory=96 << 20, pids=24)
    pool = _pool(runtime, limits_for=lambda name: small if name == "base" else None)
    assert pool.limits("base").pids == 24 and pool.limits("other") == _CONFIG.default_limits
    pool.start()
    try:
        await _until(lambda: pool.stats()["base"].size == 1, "the pool held one")
        warm = pool.claim("base")
        assert warm is not None
        assert (await warm.live.usage()).memory_limit == 96 << 20
        # 24 pids, the daemon's among them: 40 children cannot all start.
        forked = await _run(warm.daemon, f"python3 -c '{_FORK_40}'")
        assert 0 < int(forked) < 24, f"{forked.strip()} children forked under a limit of 24"
        await warm.live.kill()
        await warm.daemon.aclose()
    finally:
        await pool.aclose()


async def test_prepare_runs_in_the_sandbox_before_a_claim_can_see_it(
    runtime: LocalSandboxRuntime,
) -> None:
    let_go = asyncio.Event()
    prepared: list[Warm] = []
    reached: list[str] = []

    async def prepare(warm: Warm) -> None:
        await _run(warm.daemon, "echo prepared > /tmp/prepare-ran")
        reached.append(await _run(warm.daemon, _CONNECT_OUT))
        prepared.append(warm)
        await let_go.wait()

    pool = _pool(runtime, prepare={"base": prepare})
    pool.start()
    try:
        await _until(lambda: bool(prepared), "prepare ran")
        assert pool.claim("base") is None, "a sandbox whose prepare is running is not ready"
        assert pool.stats()["base"].size == 0
        let_go.set()
        await _until(lambda: pool.stats()["base"].size == 1, "the prepared one joined")
        warm = pool.claim("base")
        assert warm is prepared[0]
        assert await _run(warm.daemon, "cat /tmp/prepare-ran") == "prepared\n"
        # A pooled sandbox has no network: what its prepare starts reaches nothing, before
        # the claim (no route out of its namespace, no proxy) or after it.
        assert reached == ["unreachable\n"]
        assert await _run(warm.daemon, _CONNECT_OUT) == "unreachable\n"
        await warm.live.kill()
        await warm.daemon.aclose()
    finally:
        await pool.aclose()


@pytest.mark.parametrize("how", ["raises", "hangs"])
async def test_a_failing_or_hanging_prepare_never_yields_a_claim(
    runtime: LocalSandboxRuntime,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    monkeypatch.setattr(pool_module, "_RETRY_SECONDS", 0.2)
    monkeypatch.setattr(pool_module, "_PREPARE_SECONDS", 1.0)
    tried: list[LiveSandbox] = []

    async def prepare(warm: Warm) -> None:
        tried.append(warm.live)
        if how == "raises":
            raise RuntimeError("the browser agent did not answer")
        await asyncio.Event().wait()  # never set: the bound cuts it off

    budget = Budget.for_server(_CONFIG)
    pool = _pool(runtime, budget, prepare={"base": prepare})
    pool.start()
    try:
        with caplog.at_level(logging.WARNING, logger=pool_module.__name__):
            await _until(lambda: len(tried) >= 2, "a second attempt after the first failed")
            for _ in range(20):  # across attempts, nothing is ever handed out
                assert pool.claim("base") is None
                await asyncio.sleep(0.05)
        await _until(lambda: not tried[0].running, "the first sandbox was killed")
        expected = "prepare failed: RuntimeError" if how == "raises" else "longer than 1 s"
        assert any(expected in record.getMessage() for record in caplog.records), caplog.text
        assert pool.stats()["base"].hits == 0
    finally:
        await pool.aclose()
    assert all(not live.running for live in tried)
    assert budget.held(None)[0] == 0, "every discarded sandbox gave its share back"
