"""The warm pool on real sandboxes: claims are served ready, the pool refills, and nothing
of one claim is visible to the next."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.config import Config
from ringfence.models import ResourceLimits, SandboxSpec
from ringfence.service.pool import WarmPool
from ringfence.service.sandboxes import SandboxService, template_image
from ringfence.store import MemoryStore


@pytest.fixture
async def pooled(local_host: object) -> AsyncIterator[SandboxService]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    config = Config()
    runtime = LocalSandboxRuntime(LocalExecutor(config, host=local_host), config)
    pool = WarmPool(runtime, config, {"base": 2}, lambda name: template_image(name, config))
    service = SandboxService(MemoryStore(), runtime, config, pool=pool)
    service.start()
    yield service
    await service.aclose()


async def _until_ready(service: SandboxService, count: int) -> None:
    for _ in range(400):
        if service.pool_stats()["base"].size >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the pool never held {count}: {service.pool_stats()}")


async def _run(service: SandboxService, sandbox_id: str, script: str) -> str:
    daemon = await service.daemon("acme", sandbox_id)
    body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", script]}}).encode()
    response = await daemon.send(
        "POST",
        "/process.Process/Start",
        headers={"content-type": "application/connect+json"},
        content=struct.pack(">BI", 0, len(body)) + body,
    )
    raw = await response.aread()
    out = b""
    while raw:
        _, length = struct.unpack(">BI", raw[:5])
        message = json.loads(raw[5 : 5 + length])
        raw = raw[5 + length :]
        data = message.get("event", {}).get("data", {})
        if "stdout" in data:
            import base64

            out += base64.b64decode(data["stdout"])
    return out.decode()


async def test_claims_are_served_ready_and_the_pool_refills(pooled: SandboxService) -> None:
    await _until_ready(pooled, 2)
    first = await pooled.create("acme", SandboxSpec(env={"WHO": "first"}, timeout=60))
    stats = pooled.pool_stats()["base"]
    assert (stats.hits, stats.misses) == (1, 0)
    assert (
        await _run(pooled, first.id, 'echo "$WHO $RINGFENCE_SANDBOX_ID"') == f"first {first.id}\n"
    )
    await _until_ready(pooled, 2)  # refilled in the background
    custom = await pooled.create("acme", SandboxSpec(limits=ResourceLimits(memory="64M")))
    assert pooled.pool_stats()["base"].misses == 1, "custom limits are not the pool's"
    assert custom.limits.memory == 64 << 20


async def test_nothing_of_one_claim_is_visible_to_the_next(pooled: SandboxService) -> None:
    await _until_ready(pooled, 2)
    one = await pooled.create("acme", SandboxSpec(env={"SECRET": "one-only"}))
    await _run(pooled, one.id, "echo mine > /home/user/left-behind; echo x > /tmp/t")
    await pooled.kill("acme", one.id)
    two = await pooled.create("acme", SandboxSpec())
    seen = await _run(
        pooled, two.id, 'ls /home/user /tmp; echo "secret=$SECRET id=$RINGFENCE_SANDBOX_ID"'
    )
    assert "left-behind" not in seen and "one-only" not in seen
    assert f"id={two.id}" in seen and one.id not in seen
    assert pooled.pool_stats()["base"].hits == 2


async def test_a_claimed_sandbox_keeps_the_claimers_timeout(pooled: SandboxService) -> None:
    await _until_ready(pooled, 1)
    sandbox = await pooled.create("acme", SandboxSpec(timeout=1))
    for _ in range(100):
        if (await pooled.get("acme", sandbox.id)).state.value != "running":
            break
        await asyncio.sleep(0.05)
    assert (await pooled.get("acme", sandbox.id)).state.value == "expired"
