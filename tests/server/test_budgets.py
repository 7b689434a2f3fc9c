"""One budget per tenant (sandboxes and executions together, memory, CPU) and the server's
totals, through the real API on real sandboxes: ten executions of a tenant ran at once past
a ceiling of two sandboxes, each allowed 16 GiB on a 23 GiB host."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ringfence.audit.signing import SealKey
from ringfence.backends.local import LocalExecutor
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import Role
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.service.sandboxes import SandboxService
from ringfence.store import MemoryStore

pytestmark = pytest.mark.integration

M = 1 << 20
SLEEP = ["sleep", "600"]


@dataclass
class Server:
    client: httpx.AsyncClient
    acme: dict[str, str]
    globex: dict[str, str]
    sandboxes: SandboxService

    async def run(self, who: dict[str, str], name: str, **fields: Any) -> httpx.Response:
        body = {"id": name, "command": SLEEP, **fields}
        return await self.client.post("/v1/executions?wait=false", headers=who, json=body)

    async def cancel(self, who: dict[str, str], name: str) -> None:
        cancelled = await self.client.post(f"/v1/executions/{name}/cancel", headers=who)
        assert cancelled.json()["status"] == "cancelled", cancelled.text


Serving = Callable[..., contextlib.AbstractAsyncContextManager[Server]]


@pytest.fixture
def serving(local_host: object) -> Serving:
    @contextlib.asynccontextmanager
    async def serve(**settings: Any) -> AsyncIterator[Server]:
        config = Config(**{"pool_sizes": {}, **settings})
        services = await build_services(
            config, store=MemoryStore(), executor=LocalExecutor(config, host=local_host),  # type: ignore[arg-type]
            seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
        )  # fmt: skip
        store, sandboxes = services.store, services.sandboxes
        app = create_app(services)
        acme = {"X-API-Key": await mint_key(store, "acme", Role.AGENT)}
        globex = {"X-API-Key": await mint_key(store, "globex", Role.AGENT)}
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://rf.test", timeout=60) as c,
        ):
            yield Server(c, acme, globex, sandboxes)

    return serve


def _code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_concurrent_executions_past_the_tenants_budget_get_429(serving: Serving) -> None:
    async with serving(max_sandboxes_per_tenant=2) as server:
        answers = await asyncio.gather(*(server.run(server.acme, f"run-{i}") for i in range(6)))
        accepted = [a.json()["execution_id"] for a in answers if a.is_success]
        refused = [a for a in answers if not a.is_success]
        assert len(accepted) == 2, [a.text for a in answers]
        assert {_code(a) for a in refused} == {(429, "too_many_requests")}
        message = refused[0].json()["error"]["message"]
        assert "RINGFENCE_MAX_SANDBOXES_PER_TENANT=2" in message and "executions" in message
        # A sandbox is counted in the same budget as the executions.
        sandbox = await server.client.post("/v1/sandboxes", headers=server.acme, json={})
        assert _code(sandbox) == (429, "too_many_requests")
        other = await server.run(server.globex, "theirs")  # another tenant's budget
        assert other.is_success, other.text
        # Releasing one lets the next through.
        await server.cancel(server.acme, accepted[0])
        made = await server.client.post("/v1/sandboxes", headers=server.acme, json={})
        assert made.status_code == 201, made.text
        assert _code(await server.run(server.acme, "one-more")) == (429, "too_many_requests")
        sandbox_id = made.json()["id"]
        killed = await server.client.delete(f"/v1/sandboxes/{sandbox_id}", headers=server.acme)
        assert killed.status_code == 200, killed.text
        assert (await server.run(server.acme, "one-more")).is_success


async def test_memory_totals_over_the_budgets_are_refused(serving: Serving) -> None:
    async with serving(max_memory_per_tenant=1024 * M, max_total_memory=1536 * M) as server:
        big = await server.run(server.acme, "big", limits={"memory": "768M"})
        assert big.is_success, big.text
        over = await server.run(server.acme, "over", limits={"memory": "512M"})
        assert _code(over) == (429, "too_many_requests")
        assert "RINGFENCE_MAX_MEMORY_PER_TENANT" in over.json()["error"]["message"]
        sandbox = await server.client.post(
            "/v1/sandboxes", headers=server.acme, json={"limits": {"memory": "512M"}}
        )
        assert _code(sandbox) == (429, "too_many_requests")
        theirs = await server.run(server.globex, "theirs", limits={"memory": "512M"})
        assert theirs.is_success, theirs.text
        # 768M + 512M are held: the server's 1536M has no room for 512M more of anyone's.
        full = await server.run(server.globex, "full", limits={"memory": "512M"})
        assert _code(full) == (503, "server_at_capacity")
        assert "overcommit" in full.json()["error"]["message"]
        never = await server.run(server.globex, "never", limits={"memory": "2G"})
        assert _code(never) == (400, "invalid_request")
        assert never.json()["error"]["message"].startswith("limits.memory:")
        await server.cancel(server.acme, "big")  # its memory comes back
        again = await server.run(server.globex, "full", limits={"memory": "512M"})
        assert again.is_success, again.text


async def test_the_warm_pool_counts_in_the_hosts_total_and_the_claimer_pays(
    serving: Serving,
) -> None:
    default = Config().default_limits.memory
    assert default is not None
    async with serving(
        pool_sizes={"base": 1}, max_total_memory=2 * default, max_sandboxes_per_tenant=1
    ) as server:
        for _ in range(600):  # bounded: the pool starts one sandbox
            if server.sandboxes.pool_stats()["base"].size == 1:
                break
            await asyncio.sleep(0.05)
        assert server.sandboxes.pool_stats()["base"].size == 1
        # The pooled sandbox holds its share: room is left for one default's worth only.
        over = await server.run(server.globex, "over", limits={"memory": default + M})
        assert _code(over) == (503, "server_at_capacity")
        claimed = await server.client.post("/v1/sandboxes", headers=server.acme, json={})
        assert claimed.status_code == 201, claimed.text
        assert server.sandboxes.pool_stats()["base"].hits == 1
        # Claimed, it is the tenant's: acme's one place is taken.
        assert _code(await server.run(server.acme, "mine")) == (429, "too_many_requests")
