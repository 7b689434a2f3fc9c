"""Egress asks as a service: who may decide, expiry, abandonment, one ask per destination."""

from __future__ import annotations

import asyncio

import pytest

from ringfence.config import Config
from ringfence.errors import Conflict, Forbidden, NotFound
from ringfence.models import EgressAction, NetworkPolicy, Role
from ringfence.network import EgressSession, Requester
from ringfence.policy.egress import decide
from ringfence.service.audit import AuditLog
from ringfence.service.egress_asks import EgressAsks, EgressAskState
from ringfence.service.keys import Principal
from tests.integration._attack_helpers import eventually
from tests.network.conftest import audited

REQUESTER = Requester("acme", "sandbox:sb1", "agent-key")
APPROVER = Principal("acme", Role.APPROVER, "approver-key")


async def _opened(asks: EgressAsks) -> str:
    pending = await eventually(lambda: asks.list("acme", pending_only=True), what="an ask")
    ask_id: str = pending[0].id
    return ask_id


async def test_an_undecided_ask_expires_to_deny(audit: AuditLog) -> None:
    asks = EgressAsks(audit, Config(approval_ttl=0.05))
    assert await asks.ask(REQUESTER, "pay.example", 443) is False
    (ask,) = asks.list("acme")
    assert ask.state is EgressAskState.EXPIRED
    with pytest.raises(Conflict):
        await asks.decide(APPROVER, ask.id, True)
    actions = [r.action for r in await audited(audit, "network.ask.")]
    assert actions == ["network.ask.open", "network.ask.expire", "network.ask.approve"]


async def test_an_ask_whose_connection_went_away_is_abandoned(audit: AuditLog) -> None:
    asks = EgressAsks(audit, Config())
    waiting = asyncio.create_task(asks.ask(REQUESTER, "pay.example", 443))
    ask_id = await _opened(asks)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert asks.get("acme", ask_id).state is EgressAskState.ABANDONED


async def test_a_connection_gone_before_its_ask_is_on_the_record_leaves_none_pending(
    audit: AuditLog,
) -> None:
    asks = EgressAsks(audit, Config())
    waiting = asyncio.create_task(asks.ask(REQUESTER, "pay.example", 443))
    await asyncio.sleep(0)  # it runs until it waits for the audit record of the opening
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await audit.flush()
    assert asks.list("acme", pending_only=True) == [], "nothing left for a human to decide"


async def test_who_may_decide(audit: AuditLog) -> None:
    asks = EgressAsks(audit, Config())
    waiting = asyncio.create_task(asks.ask(REQUESTER, "pay.example", 443))
    ask_id = await _opened(asks)
    with pytest.raises(Forbidden):
        await asks.decide(Principal("acme", Role.AGENT, "other-agent"), ask_id, True)
    with pytest.raises(Forbidden):  # an approver key that created the sandbox itself
        await asks.decide(Principal("acme", Role.APPROVER, "agent-key"), ask_id, True)
    with pytest.raises(NotFound):
        await asks.decide(Principal("globex", Role.ADMIN, "admin"), ask_id, True)
    assert not waiting.done()
    decided = await asks.decide(Principal("acme", Role.ADMIN, "admin"), ask_id, False, "no")
    assert decided.state is EgressAskState.REJECTED and decided.decided_by == "admin"
    assert await waiting is False
    refused = [r for r in await audited(audit, "network.ask.") if r.outcome == "denied"]
    assert [r.details["why"] for r in refused] == ["agent key", "own sandbox"]


class _CountingAsker:
    def __init__(self) -> None:
        self.calls = 0
        self.answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def ask(self, requester: Requester, host: str, port: int) -> bool:
        self.calls += 1
        return await self.answer


async def test_concurrent_first_connections_share_one_ask() -> None:
    asker = _CountingAsker()
    policy = NetworkPolicy.model_validate({"rules": [{"domain": "pay.example", "action": "ask"}]})
    session = EgressSession(Requester("acme", "sandbox:sb1", "k", None, asker), policy)
    verdict = decide(policy, "pay.example", 443)
    assert verdict.action is EgressAction.ASK
    first = asyncio.create_task(session.settle(verdict, "pay.example", 443))
    second = asyncio.create_task(session.settle(verdict, "pay.example", 443))
    await eventually(lambda: asker.calls == 1, what="the ask")
    asker.answer.set_result(True)
    assert [v.action for v in await asyncio.gather(first, second)] == [EgressAction.ALLOW] * 2
    again = await session.settle(verdict, "pay.example", 443)
    assert again.action is EgressAction.ALLOW and asker.calls == 1


async def test_an_asker_that_fails_means_deny() -> None:
    class Broken:
        async def ask(self, requester: Requester, host: str, port: int) -> bool:
            raise RuntimeError("approver down")

    policy = NetworkPolicy.model_validate({"rules": [{"domain": "pay.example", "action": "ask"}]})
    session = EgressSession(Requester("acme", "sandbox:sb1", "k", None, Broken()), policy)
    verdict = await session.settle(decide(policy, "pay.example", 443), "pay.example", 443)
    assert verdict.action is EgressAction.DENY
    nobody = EgressSession(Requester("acme", "sandbox:sb2"), policy)
    verdict = await nobody.settle(decide(policy, "pay.example", 443), "pay.example", 443)
    assert verdict.action is EgressAction.DENY
