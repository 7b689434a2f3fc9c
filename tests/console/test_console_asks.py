"""Egress asks in the console, over real HTTP: a real sandbox's curl waits on a real
connection to a test origin while approvers see the ask on the pending page and decide it
with the console's forms; forged forms, agent keys, another tenant and the requester's own
key decide nothing; the history, the audit log and the webhooks show every decision."""

from __future__ import annotations

import hmac
import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from ringfence.models import AuditQuery, Role
from ringfence.server.console.pages import render
from ringfence.server.console.sessions import SessionTable
from ringfence.service.egress_asks import EgressAsk, EgressAskState
from ringfence.service.keys import Principal
from ringfence.service.webhooks import signature
from tests.console.conftest import AskConsole, csrf_of, sign_in
from tests.integration._attack_helpers import eventually
from tests.server.test_webhooks import SECRET


def _key_id(key: str) -> str:
    return key.split("_", 2)[1]


async def _page(client: httpx.AsyncClient, path: str = "/console") -> str:
    response = await client.get(path)
    assert response.status_code == 200, response.text
    return response.text


async def _post(client: httpx.AsyncClient, ask_id: str, verb: str, **form: str) -> httpx.Response:
    return await client.post(f"/console/asks/{ask_id}/{verb}", data=form)


async def _flash(client: httpx.AsyncClient) -> str:
    """The message the pending page shows after a decision (once)."""
    text = await _page(client)
    start = text.index('<p class="flash')
    return text[text.index(">", start) + 1 : text.index("</p>", start)]


async def _events(console: AskConsole, ask_id: str, count: int) -> list[dict[str, Any]]:
    """The webhook deliveries about ``ask_id``, each checked for its signature, once
    ``count`` have arrived."""

    def about() -> list[tuple[dict[str, str], bytes]]:
        return [
            (h, b) for h, b in console.webhooks.received
            if json.loads(b).get("ask", {}).get("id") == ask_id
        ]  # fmt: skip

    await eventually(lambda: len(about()) >= count, timeout=10, what=f"{count} deliveries")
    payloads = []
    for headers, body in about():
        expected = signature(SECRET, headers["ringfence-timestamp"], body)
        assert hmac.compare_digest(headers["ringfence-signature"], expected)
        payload = json.loads(body)
        assert headers["ringfence-event"] == payload["event"]
        payloads.append(payload)
    # Deliveries run concurrently: in the order of the ask's life, pending first.
    return sorted(payloads, key=lambda p: p["ask"]["decided_at"] or "")


@pytest.mark.every_store
async def test_an_approver_lets_a_waiting_connection_through_from_the_console(
    ask_console: AskConsole,
) -> None:
    console = ask_console
    sandbox_id = await console.sandbox(console.agent, "ask.test")
    waiting = console.fetch(console.agent, sandbox_id, "ask.test")
    ask = await console.pending_ask("ask.test")
    ask_id = ask["id"]
    async with console.client() as client:
        assert (await sign_in(client, console.approver)).status_code == 303
        pending = await _page(client)
        assert "Pending egress asks" in pending
        card = pending[pending.index(f"<code>{ask_id}</code>") :]
        for shown in (
            '<code class="destination">ask.test</code>',
            f"port <code>{console.origin.port}</code>",
            f"<code>sandbox:{sandbox_id}</code>",
            "<dt>Tenant</dt><dd><code>acme</code>",
            f"key <code>{_key_id(console.agent)}</code>",
            f"/console/asks/{ask_id}/approve",
            f"/console/asks/{ask_id}/reject",
        ):
            assert shown in card, shown
        assert ask["requested_by"] == _key_id(console.agent)
        for stamp in ("created_at", "expires_at"):  # waiting since, expires
            assert ask[stamp][:19].replace("T", " ") + " UTC" in card, stamp
        assert not waiting.done() and console.origin.connections == 0

        approved = await _post(
            client, ask_id, "approve", csrf=csrf_of(pending), reason="the docs mirror"
        )
        assert approved.status_code == 303 and approved.headers["location"] == "/console"
        flash = await _flash(client)
        assert flash == f"Approved: sandbox:{sandbox_id} may reach ask.test:{console.origin.port}."
        assert await waiting == "hello from origin\n"
        assert console.origin.connections == 1
        assert ask_id not in await _page(client), "no longer pending"

        # A replay is refused by the service, and says why.
        await _post(client, ask_id, "reject", csrf=csrf_of(pending), reason="changed my mind")
        assert "Not rejected: egress ask" in await _flash(client)
        assert (await console.ask(ask_id))["state"] == "approved"

        history = await _page(client, "/console/history")
        card = history[history.index(f"<code>{ask_id}</code>") :]
        assert '<span class="state approved">approved</span>' in card
        assert f"<code>{_key_id(console.approver)}</code> at " in card
        assert "the docs mirror" in card

    await console.audit.flush()
    records = await console.audit.query(AuditQuery(target=f"egress-ask:{ask_id}"))
    assert [(r.action, r.outcome, r.actor) for r in records] == [
        ("network.ask.open", "ok", f"sandbox:{sandbox_id}"),
        ("network.ask.approve", "ok", _key_id(console.approver)),
        ("network.ask.reject", "denied", _key_id(console.approver)),
    ]
    assert records[1].details["reason"] == "the docs mirror"
    opened, decided = await _events(console, ask_id, 2)
    assert opened["event"] == "network.ask.opened" and opened["tenant"] == "acme"
    assert opened["ask"]["state"] == "pending" and opened["ask"]["host"] == "ask.test"
    assert opened["ask"]["sandbox"] == f"sandbox:{sandbox_id}"
    assert decided["event"] == "network.ask.approved"
    assert decided["ask"]["decided_by"] == _key_id(console.approver)
    assert decided["ask"]["reason"] == "the docs mirror" and decided["ask"]["decided_at"]


async def test_forged_forms_agents_other_tenants_and_the_requester_decide_nothing(
    ask_console: AskConsole,
) -> None:
    console = ask_console
    # The sandbox is the first approver's own: that key must not decide its ask.
    sandbox_id = await console.sandbox(console.approver, "other.test")
    waiting = console.fetch(console.approver, sandbox_id, "other.test")
    ask_id = (await console.pending_ask("other.test"))["id"]
    approve = f"/console/asks/{ask_id}/approve"

    async with console.client() as agent:  # agents cannot sign in, so have no form to post
        assert (await sign_in(agent, console.agent)).status_code == 403
        refused = await agent.post(
            approve, data={"csrf": "x"}, headers={"Authorization": f"Bearer {console.agent}"}
        )
        assert refused.status_code == 403 and "sign in again" in refused.text
    async with console.client() as other:  # another tenant's approver, with a valid form
        await sign_in(other, console.globex_approver)
        page = await _page(other)
        assert ask_id not in page
        assert (await _post(other, ask_id, "approve", csrf=csrf_of(page))).status_code == 303
        assert "Not approved: no egress ask" in await _flash(other)
        foreign = csrf_of(page)
    async with console.client() as own:
        await sign_in(own, console.approver)
        page = await _page(own)
        assert "Your key created this sandbox" in page
        token = csrf_of(page)
        for form in ({}, {"csrf": ""}, {"csrf": token[:-1] + ("A" if token[-1] != "A" else "B")},
                     {"csrf": foreign}):  # fmt: skip
            for verb in ("approve", "reject"):
                response = await _post(own, ask_id, verb, reason="r", **form)
                assert response.status_code == 403 and "security token" in response.text
        for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
            response = await own.post(approve, data={"csrf": token}, headers=headers)
            assert response.status_code == 403 and "another site" in response.text
        await _post(own, ask_id, "approve", csrf=token)  # every check passes but this one
        assert await _flash(own) == "Not approved: the key whose sandbox asked cannot decide"
    assert not waiting.done() and console.origin.connections == 0
    assert (await console.ask(ask_id))["state"] == "pending"

    async with console.client() as second:
        await sign_in(second, console.second_approver)
        token = csrf_of(await _page(second))
        await _post(second, ask_id, "reject", csrf=token, reason="  ")
        assert await _flash(second) == "Not rejected: a rejection needs a reason."
        assert (await console.ask(ask_id))["state"] == "pending"
        await _post(second, ask_id, "reject", csrf=token, reason="not during the freeze")
        port = console.origin.port
        assert await _flash(second) == (
            f"Rejected: sandbox:{sandbox_id} may not reach other.test:{port}."
        )
        assert "403" in await waiting and console.origin.connections == 0
        history = await _page(second, "/console/history")
        card = history[history.index(f"<code>{ask_id}</code>") :]
        assert '<span class="state rejected">rejected</span>' in card
        assert "not during the freeze" in card

    await console.audit.flush()
    records = await console.audit.query(AuditQuery(target=f"egress-ask:{ask_id}"))
    assert [(r.action, r.outcome, r.details.get("why")) for r in records] == [
        ("network.ask.open", "ok", None),
        ("network.ask.approve", "denied", "own sandbox"),
        ("network.ask.reject", "ok", None),
    ]
    events = [e["event"] for e in await _events(console, ask_id, 2)]
    assert events == ["network.ask.opened", "network.ask.rejected"]


def test_ask_text_is_escaped_on_the_pages() -> None:
    """Hosts come from the sandbox (a wildcard rule matches names it chooses): whatever
    reaches an ask is rendered as text, hidden characters marked."""
    hostile = '<script>alert(1)</script>"><img src=x onerror=alert(2)>\u202e.wild.test'
    now = datetime.now(UTC)
    ask = EgressAsk(
        id="na01", state=EgressAskState.REJECTED, sandbox=f"sandbox:{hostile}", host=hostile,
        port=443, requested_by=hostile, created_at=now, expires_at=now, decided_by=hostile,
        decided_at=now, reason=hostile,
    )  # fmt: skip
    session = SessionTable().create(Principal("acme", Role.APPROVER, "k1"))
    for template in ("pending.html", "history.html"):
        html = render(
            template, session=session, csrf="t", flash=[], now=now, proposals=[],
            asks=[ask.model_copy(update={"state": EgressAskState.PENDING})]
            if template == "pending.html" else [ask],
            asks_enabled=True,
        ).body.decode()  # fmt: skip
        assert "<script>" not in html and "<img" not in html and "\u202e" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "\\u202e" in html
