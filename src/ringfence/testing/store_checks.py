"""``check_store``: the contract of ``ringfence.store.Store``, as runnable checks.

Each check takes a fresh, empty store and raises ``AssertionError`` when the store breaks the
contract. Tests run them against every implementation (memory, SQLite, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from ringfence.audit.chain import GENESIS, SEAL_ACTION, SYSTEM, AuditEvent
from ringfence.audit.signing import SealKey
from ringfence.audit.verify import verify_export
from ringfence.errors import DuplicateExecution, ExecutionNotFound, RingfenceError, SandboxNotFound
from ringfence.models import (
    ApiKey,
    AuditQuery,
    ExecutionRequest,
    ExecutionResult,
    Mount,
    Proposal,
    ProposalState,
    ResourceLimits,
    Risk,
    Role,
    Sandbox,
    SandboxState,
    Snapshot,
    Status,
    Volume,
    request_digest,
)
from ringfence.store import Store

__all__ = ["REPLICA_CHECKS", "STORE_CHECKS", "ReplicaCheck", "StoreCheck", "check_store"]

StoreCheck = Callable[[Store], Awaitable[None]]
ReplicaCheck = Callable[[Callable[[], Awaitable[Store]]], Awaitable[None]]
"""A check of a store that several replicas share: it takes a function that opens one more
replica's store on the same database (PostgreSQL)."""


def _key(key_id: str, tenant: str = "acme", role: Role = Role.AGENT) -> ApiKey:
    return ApiKey(
        key_id, tenant, role, "ab" * 32, datetime.now(UTC).replace(microsecond=0), "for tests"
    )


def _request(execution_id: str = "exec-1") -> ExecutionRequest:
    return ExecutionRequest(
        id=execution_id,
        command=["sh", "-c"],
        args=["echo hi"],
        env={"A": "1"},
        timeout=5,
        limits=ResourceLimits(memory="64M"),
        mounts=[Mount.parse("/data:/data")],
        session_id="s-1",
        task_id="t-1",
    )


def _result(
    execution_id: str, status: Status = Status.PENDING, **fields: object
) -> ExecutionResult:
    return ExecutionResult.model_validate(
        {"execution_id": execution_id, "status": status, **fields}
    )


async def keys_round_trip(store: Store) -> None:
    assert await store.count_keys() == 0
    key = _key("k1", role=Role.ADMIN)
    await store.add_key(key)
    assert await store.get_key("k1") == key
    assert await store.get_key("nope") is None
    assert await store.count_keys() == 1


async def keys_are_named_listed_revoked_and_rotated(store: Store) -> None:
    named = dataclasses.replace(_key("k1"), name="Ada's agent")
    await store.add_key(named)
    await store.add_key(_key("k2", tenant="other"))
    assert await store.get_key("k1") == named, "the name is kept"
    assert [k.key_id for k in await store.list_keys("acme")] == ["k1"]
    assert sorted(k.key_id for k in await store.list_keys()) == ["k1", "k2"]
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    rotated = await store.rotate_key("k1", "cd" * 32, later)
    assert rotated is not None and rotated.secret_hash == "cd" * 32
    assert rotated.rotated_at == later and rotated.name == "Ada's agent"
    assert await store.get_key("k1") == rotated
    assert await store.rotate_key("nope", "cd" * 32, later) is None
    revoked = await store.revoke_key("k1", later)
    assert revoked is not None and revoked.revoked and revoked.revoked_at == later
    again = await store.revoke_key("k1", later + timedelta(hours=1))
    assert again is not None and again.revoked_at == later, "the first revocation stays"
    assert await store.rotate_key("k1", "ef" * 32, later) is None, "a revoked key stays revoked"
    stored = await store.get_key("k1")
    assert stored is not None and stored.secret_hash == "cd" * 32 and stored.revoked
    assert await store.revoke_key("nope", later) is None
    [listed] = await store.list_keys("acme")
    assert listed.revoked, "revoked keys are listed, for the record"
    other = await store.get_key("k2")
    assert other is not None and not other.revoked, "only that key"


async def a_duplicate_key_id_is_refused(store: Store) -> None:
    await store.add_key(_key("k1"))
    try:
        await store.add_key(_key("k1", tenant="other"))
    except RingfenceError:
        return
    raise AssertionError("a second key with the same id was stored")


async def executions_round_trip(store: Store) -> None:
    request = _request()
    record = await store.add_execution("acme", request, _result("exec-1"))
    assert record.tenant == "acme" and record.id == "exec-1" and record.request == request
    done = _result(
        "exec-1",
        Status.SUCCEEDED,
        exit_code=0,
        logs="hi\n",
        started_at=datetime.now(UTC),
        finished_at=datetime.now(UTC),
    )
    await store.update_execution("acme", "exec-1", done)
    stored = await store.get_execution("acme", "exec-1")
    assert stored is not None and stored.result == done and stored.request == request
    assert stored.updated_at >= stored.created_at


async def executions_are_scoped_by_tenant(store: Store) -> None:
    await store.add_execution("acme", _request("same"), _result("same"))
    await store.add_execution("globex", _request("same"), _result("same", Status.RUNNING))
    acme = await store.get_execution("acme", "same")
    assert acme is not None and acme.result.status is Status.PENDING
    assert await store.get_execution("initech", "same") is None
    assert [r.tenant for r in await store.list_executions("globex")] == ["globex"]
    try:
        await store.update_execution("initech", "same", _result("same", Status.FAILED))
    except ExecutionNotFound:
        pass
    else:
        raise AssertionError("updated another tenant's execution")


async def a_duplicate_execution_is_refused(store: Store) -> None:
    await store.add_execution("acme", _request(), _result("exec-1"))
    try:
        await store.add_execution("acme", _request(), _result("exec-1"))
    except DuplicateExecution:
        return
    raise AssertionError("a second execution with the same id was stored")


async def updating_an_unknown_execution_is_not_found(store: Store) -> None:
    try:
        await store.update_execution("acme", "nope", _result("nope", Status.FAILED))
    except ExecutionNotFound:
        return
    raise AssertionError("updated an execution that does not exist")


async def listing_is_newest_first_filtered_and_limited(store: Store) -> None:
    for i in range(5):
        status = Status.SUCCEEDED if i % 2 else Status.FAILED
        await store.add_execution("acme", _request(f"e{i}"), _result(f"e{i}", status))
    listed = await store.list_executions("acme")
    assert [r.id for r in listed] == ["e4", "e3", "e2", "e1", "e0"]
    succeeded = await store.list_executions("acme", status=Status.SUCCEEDED)
    assert [r.id for r in succeeded] == ["e3", "e1"]
    assert [r.id for r in await store.list_executions("acme", limit=2)] == ["e4", "e3"]


async def unfinished_executions_fail_after_a_restart(store: Store) -> None:
    await store.add_execution("acme", _request("p"), _result("p", Status.PENDING))
    await store.add_execution("acme", _request("r"), _result("r", Status.RUNNING))
    await store.add_execution("acme", _request("d"), _result("d", Status.SUCCEEDED, exit_code=0))
    failed = await store.fail_unfinished("the server stopped")
    assert sorted(r.id for r in failed) == ["p", "r"]
    for execution_id in ("p", "r"):
        record = await store.get_execution("acme", execution_id)
        assert record is not None and record.result.status is Status.FAILED
        assert record.result.error == "the server stopped" and record.result.finished_at
    done = await store.get_execution("acme", "d")
    assert done is not None and done.result.status is Status.SUCCEEDED
    assert await store.fail_unfinished("again") == []


def _sandbox(sandbox_id: str, **metadata: str) -> Sandbox:
    now = datetime.now(UTC)
    return Sandbox(
        id=sandbox_id,
        template="base",
        state=SandboxState.RUNNING,
        metadata=metadata,
        limits=ResourceLimits(memory="64M", pids=10, cpus=0.5, disk="16M"),
        created_at=now,
        expires_at=now,
    )


async def sandboxes_round_trip(store: Store) -> None:
    sandbox = _sandbox("sb1", owner="alice")
    await store.add_sandbox("acme", sandbox)
    assert await store.get_sandbox("acme", "sb1") == sandbox
    killed = sandbox.ended(SandboxState.KILLED)
    await store.update_sandbox("acme", killed)
    assert await store.get_sandbox("acme", "sb1") == killed
    try:
        await store.add_sandbox("globex", _sandbox("sb1"))  # ids are unique across tenants
    except RingfenceError:
        pass
    else:
        raise AssertionError("a second sandbox with the same id was stored")


async def sandboxes_are_scoped_by_tenant(store: Store) -> None:
    await store.add_sandbox("acme", _sandbox("sb1"))
    assert await store.get_sandbox("globex", "sb1") is None
    assert await store.list_sandboxes("globex") == []
    try:
        await store.update_sandbox("globex", _sandbox("sb1").ended(SandboxState.KILLED))
    except SandboxNotFound:
        pass
    else:
        raise AssertionError("updated another tenant's sandbox")
    stored = await store.get_sandbox("acme", "sb1")
    assert stored is not None and stored.state is SandboxState.RUNNING


async def sandbox_listing_filters_by_state_and_metadata(store: Store) -> None:
    await store.add_sandbox("acme", _sandbox("s0", team="a", env="prod"))
    await store.add_sandbox("acme", _sandbox("s1", team="b"))
    await store.add_sandbox("acme", _sandbox("s2", team="a").ended(SandboxState.EXPIRED))
    await store.add_sandbox("acme", _sandbox("s3", team="a"))
    listed = await store.list_sandboxes("acme")
    assert [s.id for s in listed] == ["s3", "s2", "s1", "s0"]
    running = await store.list_sandboxes("acme", states=[SandboxState.RUNNING])
    assert [s.id for s in running] == ["s3", "s1", "s0"]
    team_a = await store.list_sandboxes("acme", metadata={"team": "a"})
    assert [s.id for s in team_a] == ["s3", "s2", "s0"]
    both = await store.list_sandboxes("acme", metadata={"team": "a", "env": "prod"})
    assert [s.id for s in both] == ["s0"]
    limited = await store.list_sandboxes("acme", metadata={"team": "a"}, limit=2)
    assert [s.id for s in limited] == ["s3", "s2"]
    assert [s.id for s in await store.list_sandboxes("acme", limit=1)] == ["s3"]


async def running_sandboxes_fail_after_a_restart(store: Store) -> None:
    await store.add_sandbox("acme", _sandbox("r"))
    await store.add_sandbox("globex", _sandbox("g"))
    await store.add_sandbox("acme", _sandbox("k").ended(SandboxState.KILLED))
    ended = await store.end_running_sandboxes("the server restarted")
    assert sorted((tenant, s.id) for tenant, s in ended) == [("acme", "r"), ("globex", "g")]
    stored = await store.get_sandbox("acme", "r")
    assert stored is not None and stored.state is SandboxState.FAILED
    assert stored.error == "the server restarted" and stored.ended_at and not stored.expires_at
    killed = await store.get_sandbox("acme", "k")
    assert killed is not None and killed.state is SandboxState.KILLED
    assert await store.end_running_sandboxes("again") == []


async def paused_sandboxes_on_disk_survive_a_restart(store: Store) -> None:
    paused = {"state": SandboxState.PAUSED, "expires_at": None, "timeout_left": 30.0}
    await store.add_sandbox("acme", _sandbox("disk").model_copy(update={**paused, "memory": False}))
    await store.add_sandbox(
        "acme", _sandbox("frozen").model_copy(update={**paused, "memory": True})
    )
    await store.add_sandbox("acme", _sandbox("run"))
    assert [s.id for _, s in await store.end_running_sandboxes("restarted")] == ["run"]
    ended = await store.end_running_sandboxes("restarted", frozen_error="memory lost")
    assert [(s.id, s.error) for _, s in ended] == [("frozen", "memory lost")]
    kept = await store.get_sandbox("acme", "disk")
    assert kept is not None and kept.state is SandboxState.PAUSED and kept.timeout_left == 30
    listed = await store.list_sandboxes("acme", states=[SandboxState.PAUSED])
    assert [s.id for s in listed] == ["disk"]


async def snapshots_round_trip_scoped_by_tenant(store: Store) -> None:
    snapshots = [
        Snapshot(id=f"sn{n:020x}", sandbox_id="sb1", template="base",
                 created_at=datetime.now(UTC), files=3, bytes=10, metadata={"n": str(n)})
        for n in range(3)
    ]  # fmt: skip
    for snapshot in snapshots:
        await store.add_snapshot("acme", snapshot)
    try:
        await store.add_snapshot("globex", snapshots[0])  # ids are unique across tenants
    except RingfenceError:
        pass
    else:
        raise AssertionError("a second snapshot with the same id was stored")
    assert await store.get_snapshot("acme", snapshots[1].id) == snapshots[1]
    assert await store.get_snapshot("globex", snapshots[1].id) is None
    assert await store.list_snapshots("acme", limit=2) == snapshots[:0:-1]
    assert await store.list_snapshots("globex") == []
    assert not await store.delete_snapshot("globex", snapshots[0].id)
    assert await store.delete_snapshot("acme", snapshots[0].id)
    assert not await store.delete_snapshot("acme", snapshots[0].id)
    assert [s.id for s in await store.list_snapshots("acme")] == [s.id for s in snapshots[:0:-1]]


async def volumes_round_trip_scoped_by_tenant(store: Store) -> None:
    volumes = [
        Volume(id=f"vo{n:020x}", name=f"data-{n}", quota_bytes=1 << 30,
               created_at=datetime.now(UTC))
        for n in range(3)
    ]  # fmt: skip
    for volume in volumes:
        await store.add_volume("acme", volume)
    try:
        await store.add_volume("globex", volumes[0])  # ids are unique across tenants
    except RingfenceError:
        pass
    else:
        raise AssertionError("a second volume with the same id was stored")
    try:
        await store.add_volume("acme", volumes[0].model_copy(update={"id": "vo" + "f" * 20}))
    except RingfenceError as exc:  # names are unique within a tenant
        assert exc.code == "volume_exists", exc.code
    else:
        raise AssertionError("a second volume with the same name was stored")
    await store.add_volume("globex", volumes[0].model_copy(update={"id": "vo" + "e" * 20}))
    assert await store.get_volume("acme", id=volumes[1].id) == volumes[1]
    assert await store.get_volume("acme", name="data-2") == volumes[2]
    assert await store.get_volume("globex", id=volumes[1].id) is None
    assert await store.get_volume("globex", name="data-1") is None
    assert await store.list_volumes("acme", limit=2) == volumes[:0:-1]
    assert [v.id for v in await store.list_volumes("globex")] == ["vo" + "e" * 20]
    assert not await store.delete_volume("globex", volumes[0].id)
    assert await store.delete_volume("acme", volumes[0].id)
    assert not await store.delete_volume("acme", volumes[0].id)
    assert await store.get_volume("acme", name="data-0") is None
    await store.add_volume("acme", volumes[0])  # its name is free again
    assert [v.name for v in await store.list_volumes("acme")] == ["data-0", "data-2", "data-1"]


def _event(n: int, tenant: str = "acme", action: str = "sandbox.create") -> AuditEvent:
    return AuditEvent(tenant, f"key{n % 2}", action, f"sandbox:sb{n}", details={"n": n})


async def audit_appends_form_one_verified_chain(store: Store) -> None:
    key = SealKey.generate()
    first = await store.append_audit([_event(1), _event(2)])
    assert [r.seq for r in first] == [1, 2] and first[0].prev_hash == GENESIS
    more = await asyncio.gather(*(store.append_audit([_event(n)]) for n in range(3, 9)))
    sealed = await store.append_audit([AuditEvent("", SYSTEM, SEAL_ACTION, "audit")], key.sign)
    assert sealed[0].details["public_key"] == key.public_key and len(more) == 6
    stored = await store.list_audit(AuditQuery(limit=1000))
    assert [r.seq for r in stored] == list(range(1, 10))
    verdict = verify_export([r.line() for r in stored], key.public_key)
    assert verdict.ok, verdict.problem
    assert stored[:2] == first, "what append returned is what was stored"


async def audit_queries_filter(store: Store) -> None:
    await store.append_audit(
        [
            _event(1, "acme", "sandbox.create"),
            _event(2, "globex", "sandbox.create"),
            _event(3, "acme", "proposal.approve"),
            _event(4, "acme", "proposal.reject"),
            _event(5, "", "server.start"),
        ]
    )

    async def seqs(**fields: object) -> list[int]:
        return [r.seq for r in await store.list_audit(AuditQuery(**fields))]  # type: ignore[arg-type]

    assert await seqs(tenant="acme") == [1, 3, 4]
    assert await seqs(tenant="") == [5]
    assert await seqs(action="proposal.") == [3, 4]
    assert await seqs(action="proposal") == []  # exact unless it ends with "."
    assert await seqs(action="sandbox.create", actor="key0") == [2]
    assert await seqs(target="sandbox:sb3") == [3]
    assert await seqs(after_seq=3, limit=1) == [4]
    everything = await store.list_audit(AuditQuery())
    middle = datetime.fromisoformat(everything[2].at)
    assert await seqs(since=middle) == [3, 4, 5]
    assert await seqs(until=middle) == [1, 2]


def _proposal(proposal_id: str, expires_in: float = 3600) -> Proposal:
    now = datetime.now(UTC)
    request = _request(f"fix-{proposal_id}")
    return Proposal(
        id=proposal_id,
        state=ProposalState.PENDING,
        request=request,
        digest=request_digest(request),
        rationale="the disk is full",
        risk=Risk.HIGH,
        proposed_by="agentkey",
        created_at=now,
        expires_at=now + timedelta(seconds=expires_in),
        required_approvals=2,
    )


async def proposals_change_only_from_the_version_they_saw(store: Store) -> None:
    proposal = _proposal("cp1")
    await store.add_proposal("acme", proposal)
    assert await store.get_proposal("acme", "cp1") == proposal
    assert await store.get_proposal("globex", "cp1") is None
    approved = proposal.model_copy(update={"state": ProposalState.APPROVED, "version": 1})
    rejected = proposal.model_copy(update={"state": ProposalState.REJECTED, "version": 1})
    assert await store.replace_proposal("acme", approved)
    assert not await store.replace_proposal("acme", rejected), "two changes from one version"
    assert not await store.replace_proposal("globex", approved.model_copy(update={"version": 2}))
    stored = await store.get_proposal("acme", "cp1")
    assert stored is not None and stored.state is ProposalState.APPROVED and stored.version == 1


async def proposals_keep_their_sealed_credentials(store: Store) -> None:
    # Sealed credentials are in no dump of a proposal (no answer carries them): a store that
    # writes a dump must write them too, through every change.
    sealed = _proposal("cp2").model_copy(update={"sealed_credentials": "AQ-sealed"})
    await store.add_proposal("acme", sealed)
    assert await store.get_proposal("acme", "cp2") == sealed
    approved = sealed.model_copy(update={"state": ProposalState.APPROVED, "version": 1})
    assert await store.replace_proposal("acme", approved)
    [listed] = await store.list_proposals("acme")
    assert listed.sealed_credentials == "AQ-sealed"
    [(_, running)] = await store.unfinished_proposals()
    assert running.sealed_credentials == "AQ-sealed"


async def proposals_list_and_expire(store: Store) -> None:
    await store.add_proposal("acme", _proposal("old", expires_in=-1))
    await store.add_proposal("acme", _proposal("new"))
    await store.add_proposal("globex", _proposal("theirs", expires_in=-1))
    assert [p.id for p in await store.list_proposals("acme")] == ["new", "old"]
    assert [p.id for p in await store.list_proposals("acme", limit=1)] == ["new"]
    pending = await store.list_proposals("acme", states=[ProposalState.PENDING])
    assert len(pending) == 2
    assert await store.list_proposals("acme", states=[ProposalState.EXPIRED]) == []
    running = _proposal("running").model_copy(update={"state": ProposalState.EXECUTING})
    await store.add_proposal("globex", running)
    assert [(t, p.id) for t, p in await store.unfinished_proposals()] == [("globex", "running")]
    expired = await store.expired_proposals(datetime.now(UTC))
    assert sorted((tenant, p.id) for tenant, p in expired) == [
        ("acme", "old"),
        ("globex", "theirs"),
    ]


STORE_CHECKS: tuple[StoreCheck, ...] = (
    keys_round_trip,
    keys_are_named_listed_revoked_and_rotated,
    a_duplicate_key_id_is_refused,
    executions_round_trip,
    executions_are_scoped_by_tenant,
    a_duplicate_execution_is_refused,
    updating_an_unknown_execution_is_not_found,
    listing_is_newest_first_filtered_and_limited,
    unfinished_executions_fail_after_a_restart,
    sandboxes_round_trip,
    sandboxes_are_scoped_by_tenant,
    sandbox_listing_filters_by_state_and_metadata,
    running_sandboxes_fail_after_a_restart,
    paused_sandboxes_on_disk_survive_a_restart,
    snapshots_round_trip_scoped_by_tenant,
    volumes_round_trip_scoped_by_tenant,
    audit_appends_form_one_verified_chain,
    audit_queries_filter,
    proposals_change_only_from_the_version_they_saw,
    proposals_keep_their_sealed_credentials,
    proposals_list_and_expire,
)


async def check_store(new_store: Callable[[], Awaitable[Store]]) -> None:
    """Run every check, each on a fresh store from ``new_store``."""
    for check in STORE_CHECKS:
        store = await new_store()
        try:
            await check(store)
        finally:
            await store.aclose()


async def _unfinished_work(store: Store, tag: str) -> None:
    """A running execution, a running sandbox and a proposal being executed, in ``store``."""
    await store.add_execution("acme", _request(f"run-{tag}"), _result(f"run-{tag}", Status.RUNNING))
    await store.add_sandbox("acme", _sandbox(f"sb-{tag}"))
    proposal = _proposal(f"cp-{tag}")
    await store.add_proposal("acme", proposal)
    executing = proposal.model_copy(update={"state": ProposalState.EXECUTING, "version": 1})
    assert await store.replace_proposal("acme", executing)


async def a_replica_starting_leaves_a_live_replicas_work_alone(
    open_replica: Callable[[], Awaitable[Store]],
) -> None:
    live = await open_replica()
    try:
        await _unfinished_work(live, "live")
        starting = await open_replica()
        try:
            assert await starting.fail_unfinished("restarted") == []
            assert await starting.end_running_sandboxes("restarted") == []
            assert await starting.unfinished_proposals() == []
        finally:
            await starting.aclose()
        record = await live.get_execution("acme", "run-live")
        assert record is not None and record.result.status is Status.RUNNING
        sandbox = await live.get_sandbox("acme", "sb-live")
        assert sandbox is not None and sandbox.state is SandboxState.RUNNING
    finally:
        await live.aclose()


async def a_gone_replicas_work_is_ended_once_by_replicas_starting_together(
    open_replica: Callable[[], Awaitable[Store]],
) -> None:
    gone = await open_replica()
    await _unfinished_work(gone, "gone")
    await gone.aclose()  # as a killed process's connections end
    live = await open_replica()
    first, second = await open_replica(), await open_replica()
    try:
        await _unfinished_work(live, "live")
        executions = await asyncio.gather(
            first.fail_unfinished("restarted"), second.fail_unfinished("restarted")
        )
        assert sorted(r.id for found in executions for r in found) == ["run-gone"]
        sandboxes = await asyncio.gather(
            first.end_running_sandboxes("restarted"), second.end_running_sandboxes("restarted")
        )
        assert sorted(s.id for found in sandboxes for _, s in found) == ["sb-gone"]
        assert [p.id for _, p in await first.unfinished_proposals()] == ["cp-gone"]
        # The proposal a replica changes becomes its own: once failed by one, it is done.
        ((tenant, proposal),) = await second.unfinished_proposals()
        failed = proposal.model_copy(
            update={"state": ProposalState.FAILED, "version": proposal.version + 1}
        )
        assert await first.replace_proposal(tenant, failed)
        assert not await second.replace_proposal(tenant, failed), "failed twice"
    finally:
        for store in (live, first, second):
            await store.aclose()


REPLICA_CHECKS: tuple[ReplicaCheck, ...] = (
    a_replica_starting_leaves_a_live_replicas_work_alone,
    a_gone_replicas_work_is_ended_once_by_replicas_starting_together,
)
