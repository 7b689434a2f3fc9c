"""Webhooks against a real HTTP receiver on loopback: signed, retried, never blocking; for
proposals and for egress asks."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn

from ringfence.audit.signing import SealKey
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import ExecutionRequest, ProposalSpec, Risk, Role
from ringfence.network import Requester
from ringfence.service.approvals import ApprovalService
from ringfence.service.audit import AuditLog
from ringfence.service.credentials import CredentialKey
from ringfence.service.egress_asks import EgressAsks
from ringfence.service.keys import Principal
from ringfence.service.webhooks import WebhookNotifier, signature
from ringfence.store import MemoryStore
from tests.integration._attack_helpers import eventually
from tests.network.conftest import audit

__all__ = ["audit"]

SECRET = "webhook-secret"


@dataclass
class Receiver:
    url: str = ""
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    fail_first: int = 0  # answer 500 to this many requests first
    hold: asyncio.Event | None = None  # when set: wait for it before answering
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.received.append((headers, body))
        self.arrived.set()
        if self.hold is not None:
            await self.hold.wait()
        status = 500 if len(self.received) <= self.fail_first else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    app = Receiver()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning")  # type: ignore[arg-type]
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    app.url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/hook"
    yield app
    if app.hold is not None:
        app.hold.set()
    server.should_exit = True
    await task


async def _service(local_executor: object, notifier: WebhookNotifier) -> ApprovalService:
    services = await build_services(
        Config(pool_sizes={}), store=MemoryStore(), executor=local_executor,  # type: ignore[arg-type]
        seal_key=SealKey.generate(), credentials=CredentialKey.generate(), notifier=notifier,
    )  # fmt: skip
    return services.approvals


def _spec(**env: str) -> ProposalSpec:
    request = ExecutionRequest(command=["true"], env=env)
    return ProposalSpec(request=request, rationale="disk full", risk=Risk.HIGH)


AGENT = Principal("acme", Role.AGENT, "agentkey")
APPROVER = Principal("acme", Role.APPROVER, "approverkey")


async def test_deliveries_are_signed_and_retried(
    receiver: Receiver, local_executor: object
) -> None:
    receiver.fail_first = 2
    notifier = WebhookNotifier([receiver.url], SECRET, first_backoff=0.05)
    service = await _service(local_executor, notifier)
    proposal = await service.propose(AGENT, _spec(TOKEN="s3cret-value"))
    for _ in range(200):
        if len(receiver.received) == 3:
            break
        await asyncio.sleep(0.05)
    await notifier.aclose()
    assert len(receiver.received) == 3, "two failures, then delivered"
    headers, body = receiver.received[-1]
    expected = signature(SECRET, headers["ringfence-timestamp"], body)
    assert hmac.compare_digest(headers["ringfence-signature"], expected)
    manual = hmac.new(SECRET.encode(), headers["ringfence-timestamp"].encode() + b"." + body,
                      hashlib.sha256).hexdigest()  # fmt: skip
    assert headers["ringfence-signature"] == f"sha256={manual}"
    assert headers["ringfence-event"] == "proposal.created"
    assert len({h["ringfence-delivery"] for h, _ in receiver.received}) == 1, "one delivery"
    payload = json.loads(body)
    assert payload["proposal"]["id"] == proposal.id and payload["tenant"] == "acme"
    assert payload["proposal"]["request"]["env"] == ["TOKEN"]
    assert b"s3cret-value" not in body, "environment values never leave"


async def test_a_stuck_webhook_never_blocks_a_decision(
    receiver: Receiver, local_executor: object
) -> None:
    receiver.hold = asyncio.Event()  # the receiver answers nothing until the test says so
    notifier = WebhookNotifier([receiver.url], SECRET, first_backoff=0.05)
    service = await _service(local_executor, notifier)
    proposal = await service.propose(AGENT, _spec())
    await receiver.arrived.wait()
    # Both decisions complete while the first delivery is still held open.
    once = await service.approve(APPROVER, proposal.id, proposal.digest, "ok")
    other = Principal("acme", Role.APPROVER, "secondkey")
    twice = await service.approve(other, proposal.id, proposal.digest, "ok")
    assert once.state.value == "pending" and twice.state.value == "executing"
    receiver.hold.set()
    await service.aclose()
    await notifier.aclose()


async def test_an_unreachable_webhook_gives_up_quietly(
    local_executor: object, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = WebhookNotifier(
        ["http://127.0.0.1:9/nobody"], SECRET, attempts=2, first_backoff=0.01
    )
    service = await _service(local_executor, notifier)
    proposal = await service.propose(AGENT, _spec())
    rejected = await service.reject(APPROVER, proposal.id, "no")
    assert rejected.state.value == "rejected"
    for _ in range(200):  # both deliveries (created, rejected) tried, then given up
        if sum("given up" in r.getMessage() for r in caplog.records) == 2:
            break
        await asyncio.sleep(0.05)
    await notifier.aclose()


# -- egress asks: the same deliveries ---------------------------------------------------------

REQUESTER = Requester("acme", "sandbox:sb1", "agentkey")


async def _delivered(receiver: Receiver, count: int) -> list[tuple[dict[str, str], bytes]]:
    await eventually(lambda: len(receiver.received) >= count, timeout=10, what="deliveries")
    return receiver.received


async def test_egress_asks_are_delivered_signed_and_retried(
    receiver: Receiver, audit: AuditLog
) -> None:
    receiver.fail_first = 2
    notifier = WebhookNotifier([receiver.url], SECRET, first_backoff=0.05)
    asks = EgressAsks(audit, Config(), notifier)
    waiting = asyncio.create_task(asks.ask(REQUESTER, "pay.example", 443))
    received = await _delivered(receiver, 3)  # two failures, then delivered
    assert len({h["ringfence-delivery"] for h, _ in received}) == 1, "one delivery, retried"
    headers, body = received[-1]
    assert hmac.compare_digest(
        headers["ringfence-signature"], signature(SECRET, headers["ringfence-timestamp"], body)
    )
    assert headers["ringfence-event"] == "network.ask.opened"
    opened = json.loads(body)
    assert opened["event"] == "network.ask.opened" and opened["tenant"] == "acme"
    ask = opened["ask"]
    assert (ask["state"], ask["host"], ask["port"]) == ("pending", "pay.example", 443)
    assert (ask["sandbox"], ask["requested_by"]) == ("sandbox:sb1", "agentkey")
    assert ask["created_at"] and ask["expires_at"] and ask["decided_by"] is None

    await asks.decide(APPROVER, ask["id"], False, "not this one")
    assert await waiting is False
    headers, body = (await _delivered(receiver, 4))[-1]
    assert headers["ringfence-event"] == "network.ask.rejected"
    assert hmac.compare_digest(
        headers["ringfence-signature"], signature(SECRET, headers["ringfence-timestamp"], body)
    )
    decided = json.loads(body)["ask"]
    assert (decided["id"], decided["state"]) == (ask["id"], "rejected")
    assert (decided["decided_by"], decided["reason"]) == ("approverkey", "not this one")
    assert decided["decided_at"]
    await notifier.aclose()


async def test_asks_that_close_undecided_are_delivered_too(
    receiver: Receiver, audit: AuditLog
) -> None:
    notifier = WebhookNotifier([receiver.url], SECRET, first_backoff=0.05)
    assert await EgressAsks(audit, Config(approval_ttl=0.05), notifier).ask(
        REQUESTER, "pay.example", 443
    ) is False  # fmt: skip
    asks = EgressAsks(audit, Config(), notifier)
    waiting = asyncio.create_task(asks.ask(REQUESTER, "gone.example", 443))
    await eventually(lambda: asks.list("acme", pending_only=True), what="an ask")
    waiting.cancel()  # the connection went away
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    received = await _delivered(receiver, 4)
    events = [(json.loads(b)["ask"]["host"], h["ringfence-event"]) for h, b in received]
    assert sorted(events) == [
        ("gone.example", "network.ask.abandoned"), ("gone.example", "network.ask.opened"),
        ("pay.example", "network.ask.expired"), ("pay.example", "network.ask.opened"),
    ]  # fmt: skip
    await notifier.aclose()


async def test_a_stuck_webhook_never_holds_an_ask_or_its_decision(
    receiver: Receiver, audit: AuditLog
) -> None:
    receiver.hold = asyncio.Event()  # the receiver answers nothing until the test says so
    notifier = WebhookNotifier([receiver.url], SECRET, first_backoff=0.05)
    asks = EgressAsks(audit, Config(), notifier)
    waiting = asyncio.create_task(asks.ask(REQUESTER, "pay.example", 443))
    await receiver.arrived.wait()
    (ask,) = asks.list("acme", pending_only=True)
    decided = await asks.decide(APPROVER, ask.id, True, "ok")
    assert decided.state.value == "approved" and await waiting is True
    receiver.hold.set()
    await notifier.aclose()
