"""The egress policy through the HTTP API: set at creation, read back without secrets,
changed on a live sandbox through the API only, and tenant defaults. Real sandboxes,
a real store (SQLite), a real server on loopback for the test that attacks it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ringfence.audit.signing import SealKey
from ringfence.backends.local import LocalExecutor
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import AuditQuery, NetworkPolicy, Role
from ringfence.network import EgressGateway
from ringfence.server import create_app
from ringfence.service.audit import AuditLog
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store.sql import SqlStore
from tests.integration._attack_helpers import eventually
from tests.network.conftest import Origin
from tests.server._envd import run as run_command
from tests.server.conftest import _uvicorn
from tests.store.conftest import postgres_database, sqlite_url

__all__ = ["postgres_database"]


@dataclass
class NetApi:
    client: httpx.AsyncClient
    store: SqlStore
    audit: AuditLog
    acme: dict[str, str]
    globex: dict[str, str]
    url: str
    acme_key: str
    database: Path | None  # the SQLite files; None on PostgreSQL
    approver: dict[str, str]


@pytest.fixture(params=["sqlite", "postgres"])
async def net_api(
    request: pytest.FixtureRequest,
    local_host: object,
    gateway: EgressGateway,
    http_origin: Origin,
    tmp_path: Path,
) -> AsyncIterator[NetApi]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    default = NetworkPolicy.model_validate(
        {"rules": [{"domain": "allowed.test", "cidr": "127.0.0.1/32",
                    "ports": [http_origin.port]}]}
    )  # fmt: skip
    # The test origins are on the host's loopback: the operator lets tenants name it here.
    config = Config(
        network_defaults={"globex": default}, pool_sizes={}, network_internal_cidrs=["127.0.0.1/32"]
    )
    database: Path | None = None
    if request.param == "sqlite":
        database = tmp_path / "data"
        store = await SqlStore.open(sqlite_url(database))
    else:
        store = await SqlStore.open(request.getfixturevalue("postgres_database"))
    services = await build_services(
        config, store=store, executor=LocalExecutor(config, host=local_host, egress=gateway),
        seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    acme = await mint_key(store, "acme", Role.AGENT)
    globex = await mint_key(store, "globex", Role.AGENT)
    approver = await mint_key(store, "acme", Role.APPROVER)
    # The app's lifespan runs in a task of its own: entered and left in the same task,
    # whichever tasks pytest runs the fixture's setup and teardown in.
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with app.router.lifespan_context(app), _uvicorn(app) as url:
            ready.set_result(url)
            await stop.wait()

    server = asyncio.create_task(serve())
    try:
        url = await asyncio.wait_for(asyncio.shield(ready), 30)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            yield NetApi(
                client, store, services.audit, {"Authorization": f"Bearer {acme}"},
                {"Authorization": f"Bearer {globex}"}, url, acme, database,
                {"Authorization": f"Bearer {approver}"},
            )  # fmt: skip
    finally:
        stop.set()
        await server
        await store.aclose()


def policy_json(port: int, *extra: dict[str, Any], name: str = "allowed.test") -> dict[str, Any]:
    return {"rules": [{"domain": name, "cidr": "127.0.0.1/32", "ports": [port]}, *extra]}


async def create(api: NetApi, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    response = await api.client.post("/v1/sandboxes", json=body, headers=headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def fetch(api: NetApi, headers: dict[str, str], sandbox_id: str, url: str) -> str:
    """What curl inside the sandbox says about ``url``: the body, or its error."""
    ran = await run_command(
        api.client, headers, sandbox_id, ["sh", "-c", f"curl -sS -m 20 -f {url} 2>&1; true"]
    )
    return ran.stdout


async def test_a_sandbox_created_with_a_policy_reaches_only_what_it_allows(
    net_api: NetApi, http_origin: Origin
) -> None:
    port = http_origin.port
    secret = "api-secret-" + "c0ffee" * 4
    body = policy_json(
        port,
        {"domain": "secret.test", "cidr": "127.0.0.1/32", "ports": [port],
         "headers": {"X-Api-Key": secret}},
    )  # fmt: skip
    sandbox = await create(net_api, net_api.acme, network=body)
    assert sandbox["network"]["mode"] == "rules"
    assert sandbox["network"]["rules"][1]["headers"] == {"X-Api-Key": "<redacted>"}
    assert await fetch(net_api, net_api.acme, sandbox["id"], f"http://allowed.test:{port}/") == (
        "hello from origin\n"
    )
    assert await fetch(net_api, net_api.acme, sandbox["id"], f"http://secret.test:{port}/") == (
        "hello from origin\n"
    )
    denied = await fetch(net_api, net_api.acme, sandbox["id"], f"http://other.test:{port}/")
    assert "403" in denied
    assert secret in http_origin.heads[1].decode()
    shown = await net_api.client.get(f"/v1/sandboxes/{sandbox['id']}/network", headers=net_api.acme)
    assert shown.status_code == 200 and secret not in shown.text
    await net_api.audit.flush()
    records = await net_api.audit.query(AuditQuery(target=f"sandbox:{sandbox['id']}", limit=500))
    assert secret not in repr([r.to_json() for r in records])
    connects = [r for r in records if r.action == "network.connect"]
    assert sorted(r.outcome for r in connects) == ["allowed", "allowed", "denied"]
    assert all(r.tenant == "acme" for r in connects)
    await net_api.client.delete(f"/v1/sandboxes/{sandbox['id']}", headers=net_api.acme)
    stored = await net_api.store.get_sandbox("acme", sandbox["id"])
    assert stored is not None and secret not in stored.model_dump_json()
    if net_api.database is not None:  # every byte of the SQLite files, WAL included
        files = b"".join(p.read_bytes() for p in net_api.database.rglob("*") if p.is_file())
        assert secret.encode() not in files, "the credential never reaches the store"


@pytest.mark.every_store
async def test_the_policy_of_a_live_sandbox_changes_through_the_api(
    net_api: NetApi, http_origin: Origin
) -> None:
    port = http_origin.port
    sandbox = await create(net_api, net_api.acme, network=policy_json(port))
    url = f"/v1/sandboxes/{sandbox['id']}/network"
    assert "hello" in await fetch(
        net_api, net_api.acme, sandbox["id"], f"http://allowed.test:{port}/"
    )
    changed = await net_api.client.put(url, json=policy_json(port, name="other.test"),
                                       headers=net_api.acme)  # fmt: skip
    assert changed.status_code == 200, changed.text
    assert changed.json()["rules"][0]["domain"] == "other.test"
    assert "403" in await fetch(
        net_api, net_api.acme, sandbox["id"], f"http://allowed.test:{port}/"
    )
    assert "hello" in await fetch(
        net_api, net_api.acme, sandbox["id"], f"http://other.test:{port}/"
    )
    closed = await net_api.client.put(
        url, json={"mode": "rules", "rules": []}, headers=net_api.acme
    )
    assert closed.status_code == 200
    assert "403" in await fetch(net_api, net_api.acme, sandbox["id"], f"http://other.test:{port}/")
    got = await net_api.client.get(f"/v1/sandboxes/{sandbox['id']}", headers=net_api.acme)
    assert got.json()["network"] == {"mode": "rules", "rules": []}
    await net_api.audit.flush()
    changes = await net_api.audit.query(AuditQuery(action="sandbox.network", limit=10))
    assert len(changes) == 2 and all(r.actor != "" for r in changes)


async def test_bad_policies_and_wrong_sandboxes_are_refused(
    net_api: NetApi, http_origin: Origin
) -> None:
    too_broad = await net_api.client.post(
        "/v1/sandboxes", json={"network": {"rules": [{"domain": "*.com"}]}}, headers=net_api.acme
    )
    assert too_broad.status_code == 400
    assert too_broad.json()["error"]["code"] == "invalid_request"
    assert "too broad" in too_broad.json()["error"]["message"]
    sandbox = await create(net_api, net_api.acme, network=policy_json(http_origin.port))
    url = f"/v1/sandboxes/{sandbox['id']}/network"
    for bad in ({"rules": [{"domain": "*"}]}, {"rules": [{"cidr": "0.0.0.0/0"}]},
                {"mode": "none", "rules": [{"domain": "a.example"}]}, {"rules": "x"}):  # fmt: skip
        answer = await net_api.client.put(url, json=bad, headers=net_api.acme)
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["error"]["code"] == "invalid_request"
    other_tenant = await net_api.client.put(url, json={"rules": []}, headers=net_api.globex)
    assert other_tenant.status_code == 404
    offline = await create(net_api, net_api.acme)
    assert offline["network"] == {"mode": "none", "rules": []}
    turned_on = await net_api.client.put(
        f"/v1/sandboxes/{offline['id']}/network", json=policy_json(1), headers=net_api.acme
    )
    assert turned_on.status_code == 400 and "without network" in turned_on.text
    await net_api.client.delete(url.removesuffix("/network"), headers=net_api.acme)
    ended = await net_api.client.put(url, json={"rules": []}, headers=net_api.acme)
    assert ended.status_code == 409
    assert ended.json()["error"]["code"] == "sandbox_not_running"


async def test_the_policy_cannot_be_changed_from_inside(
    net_api: NetApi, http_origin: Origin
) -> None:
    # Worst case: the sandbox holds its creator's API key. The API is on the host's loopback.
    port = http_origin.port
    sandbox = await create(net_api, net_api.acme, network=policy_json(port),
                           env={"LEAKED_KEY": net_api.acme_key})  # fmt: skip
    api_port = int(net_api.url.rsplit(":", 1)[1])
    target = f"/v1/sandboxes/{sandbox['id']}/network"
    widen = json.dumps(
        {"rules": [{"domain": "evil.test", "cidr": "127.0.0.1/32", "ports": [port]}]}
    )
    put = "-X PUT -H \"Authorization: Bearer $LEAKED_KEY\" -H 'content-type: application/json' "
    put += f"-d '{widen}'"
    attempts = {
        "direct": f"curl -sS -m 20 --noproxy '*' {put} http://127.0.0.1:{api_port}{target}",
        "proxy_ip": f"NO_PROXY= no_proxy= curl -sS -m 20 {put} "
                    f"http://127.0.0.1:{api_port}{target}",
        "proxy_name": f"curl -sS -m 20 {put} http://allowed.test:{api_port}{target}",
        "proxy_admin": "curl -sS -m 20 -X PUT http://127.0.0.1:3128/policy -d '{}'",
    }  # fmt: skip
    for name, command in attempts.items():
        ran = await run_command(
            net_api.client, net_api.acme, sandbox["id"], ["sh", "-c", command + " 2>&1; true"]
        )
        out = ran.stdout
        if name == "direct":
            assert "Connection refused" in out or "Couldn't connect" in out, (name, out)
        else:
            assert "egress denied by Ringfence" in out or "egress refused" in out, (name, out)
    shown = await net_api.client.get(target, headers=net_api.acme)
    assert shown.json() == NetworkPolicy.model_validate(policy_json(port)).model_dump(mode="json")
    assert "403" in await fetch(net_api, net_api.acme, sandbox["id"], f"http://evil.test:{port}/")
    await net_api.audit.flush()
    changes = await net_api.audit.query(AuditQuery(action="sandbox.network", limit=10))
    assert changes == []


@pytest.mark.every_store
async def test_executions_take_a_policy_or_their_tenants_default(
    net_api: NetApi, http_origin: Origin
) -> None:
    port = http_origin.port
    command = {"command": ["curl", "-sS", "-f", "-m", "20", f"http://allowed.test:{port}/"]}
    own = await net_api.client.post(
        "/v1/executions", json={**command, "network": policy_json(port)}, headers=net_api.acme
    )
    assert own.json()["status"] == "succeeded", own.text
    assert own.json()["logs"] == "hello from origin\n"
    without = await net_api.client.post("/v1/executions", json=command, headers=net_api.acme)
    assert without.json()["status"] == "failed", "acme has no default: no network"
    by_default = await net_api.client.post("/v1/executions", json=command, headers=net_api.globex)
    assert by_default.json()["status"] == "succeeded", by_default.text
    await net_api.audit.flush()
    records = await net_api.audit.query(AuditQuery(action="network.connect", tenant="globex"))
    assert [r.outcome for r in records] == ["allowed"]
    assert records[0].target.startswith("execution:")
    sandbox = await create(net_api, net_api.globex)
    assert sandbox["network"]["rules"][0]["domain"] == "allowed.test", "sandboxes too"


async def _pending_ask(api: NetApi) -> dict[str, Any]:
    async def one() -> dict[str, Any] | None:
        asks = await api.client.get("/v1/network/asks?pending=true", headers=api.approver)
        found: list[dict[str, Any]] = asks.json()
        return found[0] if found else None

    ask: dict[str, Any] = await eventually(one, timeout=30, what="an egress ask")
    return ask


@pytest.mark.every_store
async def test_ask_rules_wait_for_a_human_and_remember_the_answer(
    net_api: NetApi, http_origin: Origin
) -> None:
    port = http_origin.port
    body = {"rules": [
        {"domain": "ask.test", "cidr": "127.0.0.1/32", "ports": [port], "action": "ask"},
        {"domain": "other.test", "cidr": "127.0.0.1/32", "ports": [port], "action": "ask"},
    ]}  # fmt: skip
    sandbox = await create(net_api, net_api.acme, network=body)
    sid = sandbox["id"]

    waiting = asyncio.create_task(fetch(net_api, net_api.acme, sid, f"http://ask.test:{port}/"))
    ask = await _pending_ask(net_api)
    assert (ask["host"], ask["port"], ask["sandbox"]) == ("ask.test", port, f"sandbox:{sid}")
    assert ask["requested_by"] and http_origin.connections == 0
    assert not waiting.done(), "the connection waits for the decision"
    refused = await net_api.client.post(
        f"/v1/network/asks/{ask['id']}/approve", json={}, headers=net_api.acme
    )
    assert refused.status_code == 403, "an agent key (here: the requester's own) cannot"
    approved = await net_api.client.post(
        f"/v1/network/asks/{ask['id']}/approve", json={"reason": "docs"}, headers=net_api.approver
    )
    assert approved.status_code == 200 and approved.json()["state"] == "approved"
    assert await waiting == "hello from origin\n"
    again = await net_api.client.post(
        f"/v1/network/asks/{ask['id']}/reject", json={"reason": "x"}, headers=net_api.approver
    )
    assert again.status_code == 409

    waiting = asyncio.create_task(fetch(net_api, net_api.acme, sid, f"http://other.test:{port}/"))
    ask = await _pending_ask(net_api)
    assert ask["host"] == "other.test"
    rejected = await net_api.client.post(
        f"/v1/network/asks/{ask['id']}/reject", json={"reason": "no"}, headers=net_api.approver
    )
    assert rejected.json()["state"] == "rejected"
    assert "403" in await waiting

    # Remembered for the sandbox's life: no new ask either way.
    assert "hello" in await fetch(net_api, net_api.acme, sid, f"http://ask.test:{port}/")
    assert "403" in await fetch(net_api, net_api.acme, sid, f"http://other.test:{port}/")
    listed = await net_api.client.get("/v1/network/asks", headers=net_api.approver)
    assert sorted(a["state"] for a in listed.json()) == ["approved", "rejected"]
    assert (await net_api.client.get("/v1/network/asks", headers=net_api.globex)).json() == []
    await net_api.audit.flush()
    decisions = await net_api.audit.query(AuditQuery(action="network.ask.", limit=50))
    assert [(r.action, r.outcome) for r in decisions] == [
        ("network.ask.open", "ok"), ("network.ask.approve", "denied"),
        ("network.ask.approve", "ok"), ("network.ask.reject", "denied"),
        ("network.ask.open", "ok"), ("network.ask.reject", "ok"),
    ]  # fmt: skip
    connects = await net_api.audit.query(AuditQuery(action="network.connect", limit=50))
    assert [r.outcome for r in connects] == ["allowed", "denied", "allowed", "denied"]


async def test_tenants_cannot_reach_internal_networks_the_operator_did_not_allow(
    net_api: NetApi, http_origin: Origin
) -> None:
    for cidr in ("10.0.0.0/8", "169.254.169.254/32", "127.0.0.0/8", "192.168.1.0/24", "::1/128"):
        body = {"rules": [{"domain": "allowed.test", "cidr": cidr}]}
        created = await net_api.client.post(
            "/v1/sandboxes", json={"network": body}, headers=net_api.acme
        )
        assert created.status_code == 400, (cidr, created.text)
        assert "internal network" in created.json()["error"]["message"]
        executed = await net_api.client.post(
            "/v1/executions", json={"command": ["true"], "network": body}, headers=net_api.acme
        )
        assert executed.status_code == 400, (cidr, executed.text)
    # Internal addresses written as IPv6 (mapped, NAT64): refused too, as internal or broad.
    for cidr in ("::ffff:0.0.0.0/96", "::ffff:10.0.0.1/128", "::ffff:169.254.169.254/128",
                 "64:ff9b::/96"):  # fmt: skip
        refused = await net_api.client.post(
            "/v1/sandboxes", json={"network": {"rules": [{"cidr": cidr}]}}, headers=net_api.acme
        )
        assert refused.status_code in (400, 422), (cidr, refused.text)
        assert cidr in refused.text or "internal network" in refused.text, refused.text
    sandbox = await create(net_api, net_api.acme, network=policy_json(http_origin.port))
    widened = await net_api.client.put(
        f"/v1/sandboxes/{sandbox['id']}/network",
        json={"rules": [{"cidr": "10.0.0.0/8"}]},
        headers=net_api.acme,
    )
    assert widened.status_code == 400
    denying = {"rules": [{"cidr": "10.0.0.0/8", "action": "deny"},
                         {"domain": "allowed.test", "cidr": "127.0.0.1/32"}]}  # fmt: skip
    allowed = await net_api.client.put(
        f"/v1/sandboxes/{sandbox['id']}/network", json=denying, headers=net_api.acme
    )
    assert allowed.status_code == 200, "deny rules may name any network"
