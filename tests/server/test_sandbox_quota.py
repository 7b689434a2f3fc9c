"""A tenant runs at most ``max_sandboxes_per_tenant`` sandboxes at once, concurrent creates
included; other tenants are not held back by it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.config import Config
from ringfence.errors import InvalidRequest, TooManyRequests
from ringfence.models import SandboxSpec
from ringfence.service.budget import Budget
from ringfence.service.sandboxes import SandboxService
from ringfence.store import MemoryStore

pytestmark = pytest.mark.integration


@pytest.fixture
async def service(local_host: object) -> AsyncIterator[SandboxService]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    config = Config(max_sandboxes_per_tenant=2, pool_sizes={})
    runtime = LocalSandboxRuntime(LocalExecutor(config, host=local_host), config)
    service = SandboxService(MemoryStore(), runtime, config, budget=Budget.for_server(config))
    yield service
    await service.aclose()


async def test_concurrent_creates_stop_at_the_tenants_ceiling(service: SandboxService) -> None:
    outcomes = await asyncio.gather(
        *(service.create("acme", SandboxSpec()) for _ in range(5)), return_exceptions=True
    )
    made = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, TooManyRequests)]
    assert (len(made), len(refused)) == (2, 3), outcomes
    assert "RINGFENCE_MAX_SANDBOXES_PER_TENANT=2" in refused[0].message
    other = await service.create("globex", SandboxSpec())  # its own count
    await service.kill("acme", made[0].id)
    again = await service.create("acme", SandboxSpec())  # room again once one ended
    assert {again.id, other.id}.isdisjoint(s.id for s in made)


async def test_a_failed_create_gives_its_place_back(service: SandboxService) -> None:
    for _ in range(3):
        with pytest.raises(InvalidRequest):
            await service.create("acme", SandboxSpec(template="no-such-template"))
    first = await service.create("acme", SandboxSpec())
    second = await service.create("acme", SandboxSpec())
    assert first.id != second.id
