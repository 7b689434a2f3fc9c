"""Proposals over the HTTP API, on real sandboxes: the approval handler is the only path
that runs a remediation, and every bypass fails."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ringfence.config import Config
from ringfence.models import AuditQuery, ProposalState, Role
from ringfence.service.keys import authenticate, mint_key
from tests.server.conftest import Api

pytestmark = pytest.mark.fakes  # logic: see tests/README.md, "Which backend"

FIX = {"command": ["sh", "-c", "echo fixed"], "timeout": 30}


@pytest.fixture
async def approvers(api: Api) -> tuple[dict[str, str], dict[str, str]]:
    """Two approver keys of tenant acme (the agent key is ``api.acme``)."""
    one = await mint_key(api.store, "acme", Role.APPROVER)
    two = await mint_key(api.store, "acme", Role.APPROVER)
    return {"Authorization": f"Bearer {one}"}, {"Authorization": f"Bearer {two}"}


async def _propose(api: Api, risk: str = "low", **request: Any) -> dict[str, Any]:
    body = {"request": {**FIX, **request}, "rationale": "the disk is full", "risk": risk}
    response = await api.client.post("/v1/proposals", headers=api.acme, json=body)
    assert response.status_code == 201, response.text
    proposal: dict[str, Any] = response.json()
    return proposal


async def _approve(
    api: Api, headers: dict[str, str], proposal: dict[str, Any], digest: str | None = None
) -> tuple[int, dict[str, Any]]:
    response = await api.client.post(
        f"/v1/proposals/{proposal['id']}/approve",
        headers=headers,
        json={"digest": digest or proposal["digest"], "reason": "looks right"},
    )
    return response.status_code, response.json()


async def _finished(api: Api, proposal_id: str) -> dict[str, Any]:
    for _ in range(600):
        proposal: dict[str, Any] = (
            await api.client.get(f"/v1/proposals/{proposal_id}", headers=api.acme)
        ).json()
        if proposal["state"] in ("succeeded", "failed"):
            return proposal
        await asyncio.sleep(0.05)
    raise AssertionError(f"proposal {proposal_id} never finished")


def _code(body: dict[str, Any]) -> str:
    code: str = body["error"]["code"]
    return code


@pytest.mark.every_store
async def test_an_approved_proposal_runs_once_exactly_as_approved(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    proposal = await _propose(api)
    assert proposal["state"] == "pending" and proposal["required_approvals"] == 1
    status, approved = await _approve(api, approvers[0], proposal)
    assert status == 200 and approved["state"] == "executing", approved
    done = await _finished(api, proposal["id"])
    assert done["state"] == "succeeded" and done["result"]["logs"] == "fixed\n"
    execution = (
        await api.client.get(f"/v1/executions/{done['execution_id']}", headers=api.acme)
    ).json()
    assert execution["status"] == "succeeded"
    # What ran is the proposed request, with the approval filled in.
    approver_id = done["approvals"][0]["by"]
    runs = (await api.client.get("/v1/executions", headers=api.acme)).json()
    assert [r["execution_id"] for r in runs] == [proposal["request"]["id"]]
    await api.services.audit.flush()
    records = await api.store.list_audit(AuditQuery(tenant="acme", limit=1000))
    trail = [(r.action, r.outcome) for r in records if r.target in (
        f"proposal:{proposal['id']}", f"execution:{proposal['request']['id']}")]  # fmt: skip
    assert trail == [
        ("proposal.create", "ok"),
        ("proposal.approve", "ok"),
        ("execution.submit", "ok"),
        ("execution.start", "ok"),
        ("execution.end", "succeeded"),
        ("proposal.executed", "succeeded"),
    ], trail
    approve = next(r for r in records if r.action == "proposal.approve")
    assert approve.actor == approver_id and approve.details["digest"] == proposal["digest"]


async def test_a_remediation_cannot_run_without_approval(api: Api) -> None:
    for forged in (
        {"checkpoint_id": "cp-forged"},
        {"approved_by": "somebody"},
        {"remediation_action": "restart-db"},
        {"target_namespace": "production"},
    ):
        response = await api.client.post("/v1/executions", headers=api.acme, json={**FIX, **forged})
        assert response.status_code == 403 and _code(response.json()) == "forbidden", forged
    claimed = await api.client.post(
        "/v1/proposals",
        headers=api.acme,
        json={"request": {**FIX, "approved_by": "me"}, "rationale": "trust me"},
    )
    assert claimed.status_code == 400
    assert (await api.client.get("/v1/executions", headers=api.acme)).json() == []


async def test_nobody_approves_their_own_and_agents_never_decide(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    own = await api.client.post(
        "/v1/proposals",
        headers=approvers[0],
        json={"request": FIX, "rationale": "mine"},
    )
    status, body = await _approve(api, approvers[0], own.json())
    assert status == 403 and _code(body) == "forbidden"
    theirs = await _propose(api)
    status, body = await _approve(api, api.acme, theirs)  # the agent key
    assert status == 403 and _code(body) == "forbidden"
    rejected = await api.client.post(
        f"/v1/proposals/{theirs['id']}/reject", headers=api.acme, json={"reason": "no"}
    )
    assert rejected.status_code == 403
    for proposal_id in (own.json()["id"], theirs["id"]):
        stored = (await api.client.get(f"/v1/proposals/{proposal_id}", headers=api.acme)).json()
        assert stored["state"] == "pending" and stored["approvals"] == []
    denied = await api.store.list_audit(AuditQuery(tenant="acme", action="proposal."))
    assert sum(r.outcome == "denied" for r in denied) == 3


@pytest.mark.every_store
async def test_a_replayed_or_racing_approval_runs_nothing_more(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    proposal = await _propose(api)
    both = await asyncio.gather(*(_approve(api, h, proposal) for h in approvers))
    assert sorted(status for status, _ in both) == [200, 409], both
    done = await _finished(api, proposal["id"])
    status, body = await _approve(api, approvers[1], done)  # a replay after the run
    assert status == 409 and _code(body) == "conflict"
    runs = (await api.client.get("/v1/executions", headers=api.acme)).json()
    assert len(runs) == 1, "one approval, one execution"


async def test_a_changed_request_needs_a_new_proposal(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    proposal = await _propose(api)
    status, body = await _approve(api, approvers[0], proposal, digest="0" * 64)
    assert status == 409 and "digest" in body["error"]["message"]
    # The stored request itself changed (say, in the database): its digest no longer holds.
    stored = await api.store.get_proposal("acme", proposal["id"])
    assert stored is not None
    evil = stored.request.model_copy(update={"command": ["sh", "-c", "echo evil"]})
    assert await api.store.replace_proposal(
        "acme", stored.model_copy(update={"request": evil, "version": stored.version + 1})
    )
    status, body = await _approve(api, approvers[0], proposal)
    assert status == 409 and _code(body) == "conflict"
    assert (await api.client.get("/v1/executions", headers=api.acme)).json() == []


@pytest.mark.every_store
async def test_an_expired_proposal_cannot_be_approved(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    proposal = await _propose(api)
    stored = await api.store.get_proposal("acme", proposal["id"])
    assert stored is not None
    past = datetime.now(UTC) - timedelta(seconds=1)  # its window closed
    assert await api.store.replace_proposal(
        "acme", stored.model_copy(update={"expires_at": past, "version": stored.version + 1})
    )
    status, body = await _approve(api, approvers[0], proposal)
    assert status == 409 and "expired" in body["error"]["message"]
    expired = (await api.client.get(f"/v1/proposals/{proposal['id']}", headers=api.acme)).json()
    assert expired["state"] == "expired"
    # The sweep expires the ones nobody touches.
    other = await _propose(api)
    stored = await api.store.get_proposal("acme", other["id"])
    assert stored is not None
    await api.store.replace_proposal(
        "acme", stored.model_copy(update={"expires_at": past, "version": stored.version + 1})
    )
    assert await api.services.approvals.expire_due() == 1
    listed = await api.client.get("/v1/proposals", headers=api.acme, params={"state": "expired"})
    assert {p["id"] for p in listed.json()} == {proposal["id"], other["id"]}
    assert (await api.client.get("/v1/executions", headers=api.acme)).json() == []


@pytest.mark.every_store
async def test_a_high_risk_proposal_needs_two_approvers(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    proposal = await _propose(api, risk="high")
    assert proposal["required_approvals"] == 2
    status, once = await _approve(api, approvers[0], proposal)
    assert status == 200 and once["state"] == "pending" and len(once["approvals"]) == 1
    status, body = await _approve(api, approvers[0], proposal)  # the same approver again
    assert status == 409 and _code(body) == "conflict"
    assert (await api.client.get("/v1/executions", headers=api.acme)).json() == []
    status, twice = await _approve(api, approvers[1], proposal)
    assert status == 200 and twice["state"] == "executing"
    done = await _finished(api, proposal["id"])
    assert done["state"] == "succeeded"
    ran = await api.client.get(f"/v1/executions/{done['execution_id']}", headers=api.acme)
    assert ran.json()["status"] == "succeeded"


@pytest.mark.every_store
async def test_a_rejection_records_why_and_ends_it(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    proposal = await _propose(api)
    empty = await api.client.post(
        f"/v1/proposals/{proposal['id']}/reject", headers=approvers[0], json={"reason": ""}
    )
    assert empty.status_code == 400
    rejected = await api.client.post(
        f"/v1/proposals/{proposal['id']}/reject",
        headers=approvers[0],
        json={"reason": "wrong namespace"},
    )
    assert rejected.json()["state"] == "rejected"
    assert rejected.json()["rejection"]["reason"] == "wrong namespace"
    status, _ = await _approve(api, approvers[1], proposal)
    assert status == 409
    [record] = await api.store.list_audit(AuditQuery(action="proposal.reject"))
    assert record.details == {"reason": "wrong namespace"} and record.outcome == "ok"


async def test_another_tenant_sees_no_proposal(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    proposal = await _propose(api)
    their_approver = await mint_key(api.store, "globex", Role.APPROVER)
    headers = {"Authorization": f"Bearer {their_approver}"}
    for response in (
        await api.client.get(f"/v1/proposals/{proposal['id']}", headers=headers),
        await api.client.post(
            f"/v1/proposals/{proposal['id']}/approve",
            headers=headers,
            json={"digest": proposal["digest"], "reason": "x"},
        ),
    ):
        assert response.status_code == 404
    assert (await api.client.get("/v1/proposals", headers=headers)).json() == []
    assert ProposalState(proposal["state"]) is ProposalState.PENDING


@pytest.mark.every_store
async def test_a_proposal_cut_off_by_a_restart_is_marked_failed(api: Api) -> None:
    proposal = await _propose(api)
    stored = await api.store.get_proposal("acme", proposal["id"])
    assert stored is not None
    running = stored.model_copy(
        update={"state": ProposalState.EXECUTING, "version": stored.version + 1}
    )
    assert await api.store.replace_proposal("acme", running)
    approvals = api.services.approvals
    assert await approvals.reconcile() == 1
    failed = (await api.client.get(f"/v1/proposals/{proposal['id']}", headers=api.acme)).json()
    assert failed["state"] == "failed" and "server stopped" in failed["result"]["error"]
    assert await approvals.reconcile() == 0


async def test_a_proposer_is_refused_as_such_whatever_the_digest(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    own = await api.client.post(
        "/v1/proposals", headers=approvers[0], json={"request": FIX, "rationale": "mine"}
    )
    status, body = await _approve(api, approvers[0], own.json(), digest="0" * 64)
    assert status == 403 and _code(body) == "forbidden"
    long = await api.client.post(
        f"/v1/proposals/{own.json()['id']}/reject",
        headers=approvers[1],
        json={"reason": "x" * 10_001},
    )
    assert long.status_code == 400


async def test_an_agent_cannot_run_under_the_id_its_proposal_will_use(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    """The attack: the agent proposes, then runs its own execution under every id the
    proposal's run could take (the one it asked for, the one shown, the proposal's own), so
    the approved remediation would fail as a duplicate and point at the agent's output."""
    proposal = await _propose(api, id="remediation-run-1")
    planted: list[str] = []
    for taken in sorted({"remediation-run-1", proposal["request"]["id"], proposal["id"]}):
        forged = await api.client.post(
            "/v1/executions",
            headers=api.acme,
            json={"id": taken, "command": ["sh", "-c", "echo forged"], "timeout": 30},
        )
        if forged.status_code == 400:
            assert _code(forged.json()) == "invalid_request", forged.text
        else:
            assert forged.status_code == 200, forged.text
            planted.append(taken)
    assert planted == ["remediation-run-1"], "only ids no proposal uses are the agent's"
    status, approved = await _approve(api, approvers[0], proposal)
    assert status == 200, approved
    # Waiting for the outcome, the agent tries again under the id it now sees.
    again = await api.client.post(
        "/v1/executions",
        headers=api.acme,
        json={"id": approved["execution_id"], "command": ["sh", "-c", "echo forged"]},
    )
    assert again.status_code == 400 and _code(again.json()) == "invalid_request"
    done = await _finished(api, proposal["id"])
    assert done["state"] == "succeeded", done
    assert done["execution_id"] not in planted
    assert done["result"]["logs"] == "fixed\n"
    run = await api.client.get(f"/v1/executions/{done['execution_id']}", headers=api.acme)
    assert run.json()["logs"] == "fixed\n" and run.json()["status"] == "succeeded"


async def test_client_execution_ids_never_take_the_form_proposals_use(api: Api) -> None:
    from ringfence.client import AsyncRingfence
    from ringfence.errors import InvalidRequest

    reserved = "cp" + "0" * 20  # what a future proposal's run could be named
    response = await api.client.post(
        "/v1/executions", headers=api.acme, json={**FIX, "id": reserved}
    )
    assert response.status_code == 400 and _code(response.json()) == "invalid_request"
    async with AsyncRingfence(
        "http://ringfence.test", api_key=api.acme_key, transport=api.transport
    ) as rf:
        with pytest.raises(InvalidRequest):
            await rf.executions.run(["true"], id=reserved)
    assert (await api.client.get("/v1/executions", headers=api.acme)).json() == []


def _with_credential(value: str) -> dict[str, Any]:
    rule = {"domain": "api.vendor.example", "headers": {"Authorization": f"Bearer {value}"}}
    return {"network": {"rules": [rule]}}


async def test_the_digest_binds_credentials_the_proposal_never_shows(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    one = await _propose(api, **_with_credential("token-one"))
    two = await _propose(api, **_with_credential("token-two"))
    again = await _propose(api, **_with_credential("token-one"))
    marks = [p["request"]["network"]["rules"][0]["headers"]["Authorization"]
             for p in (one, two, again)]  # fmt: skip
    assert all(m.startswith("<redacted hmac-sha256:") for m in marks), marks
    # A marker is its proposal's own: the same value proposed again shows another one, so
    # a guess proposed by any key cannot be compared with another proposal's credential.
    assert len(set(marks)) == 3, marks
    assert one["digest"] != two["digest"], "another credential is another request"
    status, body = await _approve(api, approvers[0], one, digest=two["digest"])
    assert status == 409 and _code(body) == "conflict"
    # Someone who can write the database swaps in the other proposal's sealed values.
    stored = {p["id"]: await api.store.get_proposal("acme", p["id"]) for p in (one, two)}
    first, second = stored[one["id"]], stored[two["id"]]
    assert first is not None and second is not None and first.sealed_credentials
    swapped = first.model_copy(
        update={"sealed_credentials": second.sealed_credentials, "version": first.version + 1}
    )
    assert await api.store.replace_proposal("acme", swapped)
    status, _ = await _approve(api, approvers[0], one)
    assert status == 200
    done = await _finished(api, one["id"])
    assert done["state"] == "failed" and "credentials" in done["result"]["error"], done
    runs = (await api.client.get("/v1/executions", headers=api.acme)).json()
    assert runs == [], "nothing ran with credentials nobody approved"


@pytest.mark.every_store
async def test_credentials_sealed_under_another_key_never_run_without_them(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    from ringfence.service.approvals import ApprovalService
    from ringfence.service.credentials import CredentialKey

    proposal = await _propose(api, **_with_credential("token-one"))
    state = api.services
    # A replica (or a restart) with another key than the one that sealed them.
    elsewhere = ApprovalService(
        api.store, state.executions, state.audit, Config(), credentials=CredentialKey.generate()
    )
    approver = await authenticate(api.store, approvers[0]["Authorization"].split()[1])
    await elsewhere.approve(approver, proposal["id"], proposal["digest"], "ok")
    await elsewhere.aclose()
    done = await _finished(api, proposal["id"])
    assert done["state"] == "failed" and "credentials key" in done["result"]["error"], done
    assert (await api.client.get("/v1/executions", headers=api.acme)).json() == []


@pytest.mark.every_store
async def test_a_proposal_whose_credentials_an_upgrade_removed_must_be_proposed_again(
    api: Api, approvers: tuple[dict[str, str], dict[str, str]]
) -> None:
    from ringfence.models import REDACTED

    proposal = await _propose(api, **_with_credential("token-one"))
    stored = await api.store.get_proposal("acme", proposal["id"])
    assert stored is not None and stored.request.network is not None
    # What migration 0006 leaves of a proposal stored in clear by an older Ringfence.
    scrubbed = stored.model_copy(
        update={
            "request": stored.request.model_copy(
                update={"network": stored.request.network.redacted()}
            ),
            "sealed_credentials": None,
            "version": stored.version + 1,
        }
    )
    assert await api.store.replace_proposal("acme", scrubbed)
    shown = (await api.client.get(f"/v1/proposals/{proposal['id']}", headers=api.acme)).json()
    assert shown["request"]["network"]["rules"][0]["headers"]["Authorization"] == REDACTED
    status, body = await _approve(api, approvers[0], proposal)
    assert status == 409 and "propose it again" in body["error"]["message"]
    assert (await api.client.get("/v1/executions", headers=api.acme)).json() == []
