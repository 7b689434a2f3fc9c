"""Brokered credentials (egress rules' header values) reach the origin and nowhere else: not
an API answer, the console, a webhook, the audit log or the database, for a proposal (made,
listed, shown, approved, run), a one-shot execution and a sandbox. On the console's server
(``ask_console``): a real server over HTTP with egress, the console, webhooks, SQLite and
PostgreSQL, real sandboxes."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from ringfence.models import AuditQuery
from tests.console.conftest import AskConsole, sign_in
from tests.integration._attack_helpers import eventually


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _policy(console: AskConsole, secret: str) -> dict[str, Any]:
    port = console.origin.port
    return {
        "rules": [
            {"domain": "secret.test", "cidr": "127.0.0.1/32", "ports": [port],
             "headers": {"X-Api-Key": secret}},
        ]
    }  # fmt: skip


def _curl(console: AskConsole) -> list[str]:
    return ["curl", "-sS", "-f", "-m", "20", f"http://secret.test:{console.origin.port}/"]


async def _stored_text(request: pytest.FixtureRequest, tmp_path: Path) -> bytes:
    """Every byte of the database: the SQLite files (WAL included), or every PostgreSQL row
    of the tables the store writes."""
    names = request.fixturenames
    if "sqlite_database" in names and (tmp_path / "data").exists():
        return b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
    url = sa.make_url(request.getfixturevalue("postgres_database"))
    engine = create_async_engine(url.set(drivername="postgresql+psycopg"))
    try:
        async with engine.connect() as connection:
            rows = []
            for table in ("proposals", "executions", "sandboxes", "audit"):
                result = await connection.execute(sa.text(f"SELECT * FROM {table}"))
                rows += [repr(tuple(row)) for row in result]
    finally:
        await engine.dispose()
    return "\n".join(rows).encode()


async def _audited(console: AskConsole) -> str:
    await console.audit.flush()
    records = await console.audit.query(AuditQuery(tenant="acme", limit=5000))
    return repr([r.to_json() for r in records])


@pytest.mark.every_store
async def test_a_proposals_credential_reaches_the_origin_and_nowhere_else(
    ask_console: AskConsole, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    console = ask_console
    secret = "proposal-secret-" + secrets.token_hex(16)
    spec = {
        "request": {"command": _curl(console), "network": _policy(console, secret),
                    "timeout": 60},
        "rationale": "refresh the cache from the vendor's API",
    }  # fmt: skip
    created = await console.api.post("/v1/proposals", json=spec, headers=_bearer(console.agent))
    assert created.status_code == 201, created.text
    proposal = created.json()
    shown = proposal["request"]["network"]["rules"][0]["headers"]
    assert list(shown) == ["X-Api-Key"] and shown["X-Api-Key"].startswith("<redacted")
    answers: list[httpx.Response] = [created]
    for key in (console.agent, console.approver):
        answers.append(await console.api.get(f"/v1/proposals/{proposal['id']}",
                                             headers=_bearer(key)))  # fmt: skip
        answers.append(await console.api.get("/v1/proposals", headers=_bearer(key)))
    pages: list[httpx.Response] = []
    async with console.client() as browser:
        await sign_in(browser, console.approver)
        pages += [await browser.get("/console"),
                  await browser.get(f"/console/proposals/{proposal['id']}")]  # fmt: skip
        approved = await console.api.post(
            f"/v1/proposals/{proposal['id']}/approve",
            json={"digest": proposal["digest"], "reason": "the vendor asked"},
            headers=_bearer(console.approver),
        )
        assert approved.status_code == 200, approved.text
        answers.append(approved)

        async def finished() -> dict[str, Any] | None:
            now = await console.api.get(f"/v1/proposals/{proposal['id']}",
                                        headers=_bearer(console.agent))  # fmt: skip
            body: dict[str, Any] = now.json()
            return body if body["state"] in ("succeeded", "failed") else None

        done = await eventually(finished, timeout=60, what="the approved proposal's outcome")
        pages += [await browser.get(f"/console/proposals/{proposal['id']}"),
                  await browser.get("/console/history"),
                  await browser.get("/console/audit")]  # fmt: skip
    assert done["state"] == "succeeded", done
    assert done["result"]["logs"] == "hello from origin\n"
    assert any(secret in head.decode() for head in console.origin.heads), "the origin got it"
    answers.append(await console.api.get(f"/v1/executions/{done['execution_id']}",
                                         headers=_bearer(console.agent)))  # fmt: skip
    answers.append(await console.api.get("/v1/executions", headers=_bearer(console.agent)))
    for answer in answers:
        assert answer.status_code in (200, 201), answer.text
        assert secret not in answer.text, answer.request.url
    for page in pages:
        assert page.status_code == 200, page.request.url
        assert secret not in page.text, page.request.url

    async def delivered() -> bool | None:
        events = [b for _, b in console.webhooks.received if b"proposal.succeeded" in b]
        return True if events else None

    await eventually(delivered, timeout=30, what="the proposal.succeeded webhook")
    assert len(console.webhooks.received) >= 3  # created, approved, succeeded
    assert all(secret.encode() not in body for _, body in console.webhooks.received)
    assert secret not in await _audited(console)
    assert secret.encode() not in await _stored_text(request, tmp_path)


@pytest.mark.every_store
async def test_an_executions_credential_reaches_the_origin_and_nowhere_else(
    ask_console: AskConsole, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    console = ask_console
    secret = "execution-secret-" + secrets.token_hex(16)
    body = {"command": _curl(console), "network": _policy(console, secret), "timeout": 60}
    ran = await console.api.post("/v1/executions", json=body, headers=_bearer(console.agent))
    assert ran.status_code == 200 and ran.json()["status"] == "succeeded", ran.text
    assert any(secret in head.decode() for head in console.origin.heads), "the origin got it"
    answers = [
        ran,
        await console.api.get(f"/v1/executions/{ran.json()['execution_id']}",
                              headers=_bearer(console.agent)),
        await console.api.get("/v1/executions", headers=_bearer(console.agent)),
    ]  # fmt: skip
    for answer in answers:
        assert answer.status_code == 200 and secret not in answer.text, answer.request.url
    assert secret not in await _audited(console)
    assert secret.encode() not in await _stored_text(request, tmp_path)


@pytest.mark.every_store
async def test_a_sandboxes_credential_reaches_the_origin_and_nowhere_else(
    ask_console: AskConsole, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    console = ask_console
    secret, changed = ("sandbox-secret-" + secrets.token_hex(16) for _ in range(2))
    agent = _bearer(console.agent)
    created = await console.api.post(
        "/v1/sandboxes", json={"network": _policy(console, secret)}, headers=agent
    )
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    assert created.json()["network"]["rules"][0]["headers"] == {"X-Api-Key": "<redacted>"}
    fetched = console.fetch(console.agent, sandbox_id, "secret.test")
    assert await fetched == "hello from origin\n"
    replaced = await console.api.put(
        f"/v1/sandboxes/{sandbox_id}/network", json=_policy(console, changed), headers=agent
    )
    assert await console.fetch(console.agent, sandbox_id, "secret.test") == "hello from origin\n"
    heads = b"".join(console.origin.heads).decode()
    assert secret in heads and changed in heads, "the origin got both, in turn"
    answers = [
        created,
        replaced,
        await console.api.get(f"/v1/sandboxes/{sandbox_id}", headers=agent),
        await console.api.get("/v1/sandboxes", headers=agent),
        await console.api.get(f"/v1/sandboxes/{sandbox_id}/network", headers=agent),
    ]
    await console.api.delete(f"/v1/sandboxes/{sandbox_id}", headers=agent)
    for answer in answers:
        assert answer.status_code in (200, 201), answer.text
        assert secret not in answer.text and changed not in answer.text, answer.request.url
    audited = await _audited(console)
    assert secret not in audited and changed not in audited
    stored = await _stored_text(request, tmp_path)
    assert secret.encode() not in stored and changed.encode() not in stored
