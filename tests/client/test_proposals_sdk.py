"""``rf.proposals`` against a real server: an agent proposes, approvers decide, it runs once."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from ringfence.client import (
    AsyncRingfence,
    ProposalNotFound,
    ProposalState,
    Ringfence,
    WaitTimeout,
)
from ringfence.client._proposals import build_spec, delays
from ringfence.errors import Conflict, Forbidden, InvalidRequest, NotFound
from ringfence.models import ExecutionRequest, Status
from tests.client.conftest import LiveServer


@dataclass(frozen=True)
class Keys:
    agent: str
    approver: str
    second_approver: str


@pytest.fixture(scope="module")
def keys(live: LiveServer) -> Keys:
    return Keys(live.mint_key("agent"), live.mint_key("approver"), live.mint_key("approver"))


@pytest.fixture
async def agent(live: LiveServer, keys: Keys) -> AsyncIterator[AsyncRingfence]:
    async with AsyncRingfence(live.url, keys.agent) as rf:
        yield rf


@pytest.fixture
async def approver(live: LiveServer, keys: Keys) -> AsyncIterator[AsyncRingfence]:
    async with AsyncRingfence(live.url, keys.approver) as rf:
        yield rf


@pytest.fixture
def sync_approver(live: LiveServer, keys: Keys) -> Iterator[Ringfence]:
    with Ringfence(live.url, keys.approver) as rf:
        yield rf


@pytest.mark.every_store
async def test_an_approved_proposal_runs_once_and_waits_for_its_output(
    agent: AsyncRingfence, approver: AsyncRingfence
) -> None:
    proposal = await agent.proposals.create(
        ["sh", "-c", 'echo "fixed $TARGET"'], rationale="the lock is stale",
        env={"TARGET": "db"}, timeout=30, session_id="s-1", task_id="t-1",
        remediation_action="clear-lock",
    )  # fmt: skip
    assert (proposal.state, proposal.required_approvals) == (ProposalState.PENDING, 1)
    assert (proposal.session_id, proposal.request.session_id) == ("s-1", "s-1")
    assert await approver.proposals.get(proposal.id) == proposal
    pending = await approver.proposals.list(state="pending")
    assert proposal.id in [p.id for p in pending]

    approved = await approver.proposals.approve(
        proposal.id, digest=proposal.digest, reason="checked the lock"
    )
    assert approved.state in (ProposalState.EXECUTING, ProposalState.SUCCEEDED)
    done = await agent.proposals.wait(proposal.id, timeout=60)
    assert done.state is ProposalState.SUCCEEDED
    assert done.result is not None
    assert (done.result.status, done.result.exit_code, done.result.logs) == (
        Status.SUCCEEDED, 0, "fixed db\n",
    )  # fmt: skip
    assert [a.reason for a in done.approvals] == ["checked the lock"]
    listed = await agent.proposals.list(state=["succeeded", ProposalState.FAILED])
    assert proposal.id in [p.id for p in listed]

    with pytest.raises(Conflict):  # a replay runs nothing again
        await approver.proposals.approve(proposal.id, digest=proposal.digest)


def test_the_sync_twin_approves_the_digest_it_reads_and_reports_a_failure(
    live: LiveServer, keys: Keys, sync_approver: Ringfence
) -> None:
    with Ringfence(live.url, keys.agent) as agent:
        request = ExecutionRequest(command=["sh", "-c", "echo broken; exit 3"], timeout=30)
        proposal = agent.proposals.create(request, rationale="try it", session_id="s-2")
        # Exactly the request sent, but for its id: the server names the proposal's run.
        assert proposal.request == request.model_copy(update={"id": proposal.id})
        assert proposal.session_id == "s-2"
        sync_approver.proposals.approve(proposal.id)  # no digest: the one it holds now
        done = agent.proposals.wait(proposal.id, timeout=60)
    assert done.state is ProposalState.FAILED
    assert done.result is not None and done.result.exit_code == 3
    assert done.result.logs == "broken\n"


async def test_a_rejected_proposal_never_runs(
    agent: AsyncRingfence, approver: AsyncRingfence
) -> None:
    proposal = await agent.proposals.create(["true"], rationale="restart it")
    rejected = await approver.proposals.reject(proposal.id, reason="not during the freeze")
    assert rejected.state is ProposalState.REJECTED
    assert rejected.rejection is not None
    assert rejected.rejection.reason == "not during the freeze"
    assert await agent.proposals.wait(proposal.id, timeout=5) == rejected
    with pytest.raises(Conflict):
        await approver.proposals.approve(proposal.id, digest=proposal.digest)
    assert (await agent.proposals.get(proposal.id)).execution_id is None


@pytest.mark.every_store
async def test_a_high_risk_proposal_needs_two_approvers(
    live: LiveServer, keys: Keys, agent: AsyncRingfence, approver: AsyncRingfence
) -> None:
    proposal = await agent.proposals.create(["true"], rationale="drop the cache", risk="high")
    assert proposal.required_approvals == 2
    once = await approver.proposals.approve(proposal.id, digest=proposal.digest)
    assert (once.state, len(once.approvals)) == (ProposalState.PENDING, 1)
    with pytest.raises(Conflict):  # the same approver twice
        await approver.proposals.approve(proposal.id, digest=proposal.digest)
    async with AsyncRingfence(live.url, keys.second_approver) as second:
        await second.proposals.approve(proposal.id, digest=proposal.digest)
    assert (await agent.proposals.wait(proposal.id, timeout=60)).state is ProposalState.SUCCEEDED


async def test_who_may_decide(
    live: LiveServer, agent: AsyncRingfence, approver: AsyncRingfence
) -> None:
    mine = await approver.proposals.create(["true"], rationale="my own")
    with pytest.raises(Forbidden) as own:
        await approver.proposals.approve(mine.id, digest=mine.digest)
    assert own.value.code == "forbidden"

    theirs = await agent.proposals.create(["true"], rationale="an agent's")
    with pytest.raises(Forbidden):
        await agent.proposals.approve(theirs.id, digest=theirs.digest)
    with pytest.raises(Forbidden):
        await agent.proposals.reject(theirs.id, reason="no")
    with pytest.raises(Conflict):  # a digest other than the proposed request's
        await approver.proposals.approve(theirs.id, digest="0" * 64)
    assert (await agent.proposals.get(theirs.id)).state is ProposalState.PENDING


async def test_another_tenants_proposal_is_not_found(
    live: LiveServer, agent: AsyncRingfence
) -> None:
    proposal = await agent.proposals.create(["true"], rationale="ours")
    async with AsyncRingfence(live.url, live.other_key) as other:
        for attempt in (
            other.proposals.get(proposal.id),
            other.proposals.approve(proposal.id, digest=proposal.digest),
            other.proposals.approve(proposal.id),
            other.proposals.reject(proposal.id, reason="no"),
            other.proposals.wait(proposal.id),
        ):
            with pytest.raises(ProposalNotFound) as exc:
                await attempt
            assert isinstance(exc.value, NotFound) and exc.value.code == "not_found"
        assert proposal.id not in [p.id for p in await other.proposals.list()]


async def test_wait_gives_up_at_its_timeout(agent: AsyncRingfence) -> None:
    proposal = await agent.proposals.create(["true"], rationale="nobody will look")
    with pytest.raises(WaitTimeout) as exc:
        await agent.proposals.wait(proposal.id, timeout=0.3)
    assert exc.value.code == "wait_timeout"
    assert exc.value.proposal.state is ProposalState.PENDING


async def test_bad_input_is_refused_before_anything_is_sent(agent: AsyncRingfence) -> None:
    for bad in (
        agent.proposals.create(["true"], rationale="x", timeout=-1),
        agent.proposals.create(["true"], rationale="x", risk="medium"),
        agent.proposals.create(["true"], rationale=""),
        agent.proposals.list(state="maybe"),
    ):
        with pytest.raises(InvalidRequest):
            await bad
    with pytest.raises(InvalidRequest):  # refused by the server
        await agent.proposals.create(["true"], rationale="x", checkpoint_id="cp-forged")


def test_a_whole_request_is_sent_as_given_and_lends_its_labels() -> None:
    request = ExecutionRequest(command=["true"], session_id="s", task_id="t")
    spec = build_spec(request, rationale="r", risk="low", session_id=None, task_id=None, fields={})
    assert (spec.request, spec.session_id, spec.task_id) == (request, "s", "t")
    labelled = build_spec(
        ["true"], rationale="r", risk="high", session_id="s2", task_id=None, fields={}
    )
    assert (labelled.request.session_id, labelled.request.task_id) == ("s2", None)


def test_polling_backs_off_to_a_bound() -> None:
    first = list(itertools.islice(delays(), 20))
    assert first[0] == 0.1 and max(first) == 2.0
    assert first == sorted(first)
