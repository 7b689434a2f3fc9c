"""The operator's risk policy on a real server (SQLite, real sandboxes): an agent that says
``low`` for what the operator calls high still needs two approvers, a forbidden proposal is
refused naming the rule, and ``ringfence serve`` with a broken policy does not start."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ringfence.audit.signing import SealKey
from ringfence.backends.local import LocalExecutor
from ringfence.compose import Services, build_services
from ringfence.config import Config
from ringfence.models import AuditQuery, Role
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store.sql import SqlStore
from tests.server.conftest import sqlite_database

__all__ = ["sqlite_database"]

POLICY = """
@id("rm-is-high")
permit (principal, action == Ringfence::Action::"high_risk", resource)
when { context.argv.contains("rm") };

@id("never-kube-system")
forbid (principal, action == Ringfence::Action::"propose", resource)
when { context.target_namespace == "kube-system" };
"""
RM = {"command": ["sh", "-c", "echo rm ran", "rm"], "timeout": 30}
RINGFENCE = str(Path(sys.executable).parent / "ringfence")


class Server:
    def __init__(self, client: httpx.AsyncClient, services: Services, keys: dict[str, str]) -> None:
        self.client = client
        self.services = services
        self.store = services.store
        self.keys = {role: {"Authorization": f"Bearer {key}"} for role, key in keys.items()}

    async def propose(self, risk: str, **request: Any) -> httpx.Response:
        body = {"request": {**RM, **request}, "rationale": "tidy up", "risk": risk}
        return await self.client.post("/v1/proposals", headers=self.keys["agent"], json=body)

    async def approve(self, who: str, proposal: dict[str, Any]) -> dict[str, Any]:
        response = await self.client.post(
            f"/v1/proposals/{proposal['id']}/approve",
            headers=self.keys[who],
            json={"digest": proposal["digest"]},
        )
        assert response.status_code == 200, response.text
        approved: dict[str, Any] = response.json()
        return approved


@pytest.fixture
async def server(local_host: object, sqlite_database: str, tmp_path: Path) -> AsyncIterator[Server]:
    policy = tmp_path / "risk.cedar"
    policy.write_text(POLICY)
    config = Config(risk_policy=policy, pool_sizes={})
    store = await SqlStore.open(sqlite_database)
    services = await build_services(
        config, store=store, executor=LocalExecutor(config, host=local_host),  # type: ignore[arg-type]
        seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    keys = {
        "agent": await mint_key(store, "acme", Role.AGENT),
        "one": await mint_key(store, "acme", Role.APPROVER),
        "two": await mint_key(store, "acme", Role.APPROVER),
    }
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=transport, base_url="http://ringfence.test", timeout=30
            ) as client,
        ):
            yield Server(client, services, keys)
    finally:
        await store.aclose()


async def test_an_agent_saying_low_for_what_the_operator_calls_high_needs_two_approvers(
    server: Server,
) -> None:
    response = await server.propose("low")
    assert response.status_code == 201, response.text
    proposal = response.json()
    assert proposal["risk"] == "high" and proposal["required_approvals"] == 2
    assert proposal["risk_source"] == "policy" and proposal["risk_rules"] == ["rm-is-high"]
    once = await server.approve("one", proposal)
    assert once["state"] == "pending"  # one approver is not enough
    assert (await server.client.get("/v1/executions", headers=server.keys["agent"])).json() == []
    assert (await server.approve("two", proposal))["state"] == "executing"
    for _ in range(600):
        done = (
            await server.client.get(f"/v1/proposals/{proposal['id']}", headers=server.keys["one"])
        ).json()
        if done["state"] in ("succeeded", "failed"):
            break
        await asyncio.sleep(0.05)
    assert done["state"] == "succeeded" and done["result"]["logs"] == "rm ran\n", done


async def test_a_proposer_raises_the_risk_but_cannot_lower_it(server: Server) -> None:
    raised = (await server.propose("high", command=["echo", "harmless"])).json()
    assert (raised["risk"], raised["risk_source"], raised["risk_rules"]) == ("high", "proposer", [])
    assert raised["required_approvals"] == 2
    plain = (await server.propose("low", command=["echo", "harmless"])).json()
    assert (plain["risk"], plain["risk_source"]) == ("low", "proposer")
    assert plain["required_approvals"] == 1


async def test_a_forbidden_proposal_is_refused_naming_the_rule(server: Server) -> None:
    response = await server.propose("high", target_namespace="kube-system")
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "forbidden" and "never-kube-system" in error["message"]
    assert (await server.client.get("/v1/proposals", headers=server.keys["one"])).json() == []
    await server.services.audit.flush()
    records = await server.store.list_audit(AuditQuery(tenant="acme", action="proposal."))
    assert [(r.action, r.outcome) for r in records] == [("proposal.create", "denied")]
    assert records[0].details["risk_rules"] == ["never-kube-system"]


def test_serve_with_a_broken_policy_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    policy = tmp_path / "risk.cedar"
    policy.write_text('@id("typo")\nforbid (principal, action, resource) when { context.nme };')
    data = tmp_path / "data"
    ran = subprocess.run(
        [RINGFENCE, "serve", "--port", "0", "--data-dir", str(data)],
        env={**os.environ, "RINGFENCE_RISK_POLICY": str(policy)},
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ran.returncode != 0
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and str(policy) in lines[0] and "nme" in lines[0], ran.stderr
    assert not data.exists()  # nothing was created or changed
