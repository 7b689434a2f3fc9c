"""An in-memory ``Store``: for tests, and for a server that may forget everything."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from datetime import UTC, datetime

from ringfence.audit.chain import GENESIS, AuditEvent, AuditRecord, Sign, chain, timestamp
from ringfence.errors import (
    DuplicateExecution,
    ExecutionNotFound,
    SandboxNotFound,
    StoreError,
    VolumeExists,
)
from ringfence.models import (
    ApiKey,
    AuditQuery,
    ExecutionRecord,
    ExecutionRequest,
    ExecutionResult,
    Proposal,
    ProposalState,
    Sandbox,
    SandboxState,
    Snapshot,
    Status,
    Volume,
)

__all__ = ["MemoryStore"]


class MemoryStore:
    def __init__(self) -> None:
        self._keys: dict[str, ApiKey] = {}
        self._executions: dict[tuple[str, str], ExecutionRecord] = {}
        self._sandboxes: dict[str, tuple[str, Sandbox]] = {}  # id -> (tenant, sandbox), in order
        self._audit: list[AuditRecord] = []
        self._proposals: dict[str, tuple[str, Proposal]] = {}  # id -> (tenant, ...), in order
        self._snapshots: dict[str, tuple[str, Snapshot]] = {}  # id -> (tenant, ...), in order
        self._volumes: dict[str, tuple[str, Volume]] = {}  # id -> (tenant, ...), in order

    async def add_key(self, key: ApiKey) -> None:
        if key.key_id in self._keys:
            raise StoreError(f"a key with id {key.key_id!r} exists")
        self._keys[key.key_id] = key

    async def get_key(self, key_id: str) -> ApiKey | None:
        return self._keys.get(key_id)

    async def count_keys(self) -> int:
        return len(self._keys)

    async def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        return [k for k in self._keys.values() if tenant is None or k.tenant == tenant]

    async def revoke_key(self, key_id: str, at: datetime) -> ApiKey | None:
        key = self._keys.get(key_id)
        if key is not None and key.revoked_at is None:
            key = self._keys[key_id] = dataclasses.replace(key, revoked_at=at)
        return key

    async def rotate_key(self, key_id: str, secret_hash: str, at: datetime) -> ApiKey | None:
        key = self._keys.get(key_id)
        if key is None or key.revoked_at is not None:
            return None
        key = self._keys[key_id] = dataclasses.replace(key, secret_hash=secret_hash, rotated_at=at)
        return key

    async def add_execution(
        self, tenant: str, request: ExecutionRequest, result: ExecutionResult
    ) -> ExecutionRecord:
        if (tenant, request.id) in self._executions:
            raise DuplicateExecution(f"an execution with id {request.id!r} already exists")
        now = datetime.now(UTC)
        record = ExecutionRecord(tenant, request.id, request, result, now, now)
        self._executions[tenant, request.id] = record
        return record

    async def update_execution(
        self, tenant: str, execution_id: str, result: ExecutionResult
    ) -> None:
        record = self._executions.get((tenant, execution_id))
        if record is None:
            raise ExecutionNotFound(f"no execution with id {execution_id!r}")
        self._executions[tenant, execution_id] = dataclasses.replace(
            record, result=result, updated_at=datetime.now(UTC)
        )

    async def get_execution(self, tenant: str, execution_id: str) -> ExecutionRecord | None:
        return self._executions.get((tenant, execution_id))

    async def list_executions(
        self, tenant: str, *, status: Status | None = None, limit: int = 100
    ) -> list[ExecutionRecord]:
        records = [
            r
            for (t, _), r in self._executions.items()
            if t == tenant and (status is None or r.result.status is status)
        ]
        records.sort(key=lambda r: r.created_at, reverse=True)
        return records[:limit]

    async def fail_unfinished(self, error: str) -> list[ExecutionRecord]:
        failed = []
        for (tenant, execution_id), record in list(self._executions.items()):
            if not record.result.status.is_terminal:
                result = record.result.model_copy(
                    update={
                        "status": Status.FAILED,
                        "error": error,
                        "finished_at": datetime.now(UTC),
                    }
                )
                await self.update_execution(tenant, execution_id, result)
                failed.append(self._executions[tenant, execution_id])
        return failed

    async def add_sandbox(self, tenant: str, sandbox: Sandbox) -> None:
        if sandbox.id in self._sandboxes:
            raise StoreError(f"a sandbox with id {sandbox.id!r} exists")
        self._sandboxes[sandbox.id] = (tenant, sandbox)

    async def update_sandbox(self, tenant: str, sandbox: Sandbox) -> None:
        if await self.get_sandbox(tenant, sandbox.id) is None:
            raise SandboxNotFound(f"no sandbox with id {sandbox.id!r}")
        self._sandboxes[sandbox.id] = (tenant, sandbox)

    async def get_sandbox(self, tenant: str, sandbox_id: str) -> Sandbox | None:
        owner, sandbox = self._sandboxes.get(sandbox_id, (None, None))
        return sandbox if owner == tenant else None

    async def list_sandboxes(
        self,
        tenant: str,
        *,
        states: Collection[SandboxState] | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 100,
    ) -> list[Sandbox]:
        wanted = (metadata or {}).items()
        found = [
            sandbox
            for owner, sandbox in reversed(self._sandboxes.values())
            if owner == tenant
            and (states is None or sandbox.state in states)
            and wanted <= sandbox.metadata.items()
        ]
        return found[: max(limit, 0)]

    async def end_running_sandboxes(
        self, error: str, frozen_error: str | None = None
    ) -> list[tuple[str, Sandbox]]:
        ended = []
        for tenant, sandbox in list(self._sandboxes.values()):
            why = _lost(sandbox, error, frozen_error)
            if why is not None:
                failed = sandbox.ended(SandboxState.FAILED, why)
                self._sandboxes[sandbox.id] = (tenant, failed)
                ended.append((tenant, failed))
        return ended

    async def add_snapshot(self, tenant: str, snapshot: Snapshot) -> None:
        if snapshot.id in self._snapshots:
            raise StoreError(f"a snapshot with id {snapshot.id!r} exists")
        self._snapshots[snapshot.id] = (tenant, snapshot)

    async def get_snapshot(self, tenant: str, snapshot_id: str) -> Snapshot | None:
        owner, snapshot = self._snapshots.get(snapshot_id, (None, None))
        return snapshot if owner == tenant else None

    async def list_snapshots(self, tenant: str, *, limit: int = 100) -> list[Snapshot]:
        found = [s for owner, s in reversed(self._snapshots.values()) if owner == tenant]
        return found[: max(limit, 0)]

    async def delete_snapshot(self, tenant: str, snapshot_id: str) -> bool:
        if await self.get_snapshot(tenant, snapshot_id) is None:
            return False
        del self._snapshots[snapshot_id]
        return True

    async def add_volume(self, tenant: str, volume: Volume) -> None:
        if volume.id in self._volumes:
            raise StoreError(f"a volume with id {volume.id!r} exists")
        if await self.get_volume(tenant, name=volume.name) is not None:
            raise VolumeExists(f"you have a volume named {volume.name!r} already")
        self._volumes[volume.id] = (tenant, volume)

    async def get_volume(
        self, tenant: str, *, id: str | None = None, name: str | None = None
    ) -> Volume | None:
        for owner, volume in self._volumes.values():
            if owner == tenant and (volume.id == id or volume.name == name):
                return volume
        return None

    async def list_volumes(self, tenant: str, *, limit: int = 100) -> list[Volume]:
        found = [v for owner, v in reversed(self._volumes.values()) if owner == tenant]
        return found[: max(limit, 0)]

    async def delete_volume(self, tenant: str, volume_id: str) -> bool:
        if await self.get_volume(tenant, id=volume_id) is None:
            return False
        del self._volumes[volume_id]
        return True

    async def append_audit(
        self, events: list[AuditEvent], sign: Sign | None = None
    ) -> list[AuditRecord]:
        last = self._audit[-1] if self._audit else None
        records = chain(events, last.seq if last else 0, last.hash if last else GENESIS, sign)
        self._audit += records
        return records

    async def list_audit(self, query: AuditQuery) -> list[AuditRecord]:
        found = [r for r in self._audit if r.seq > query.after_seq and _audit_matches(query, r)]
        return found[: max(query.limit, 0)]

    async def add_proposal(self, tenant: str, proposal: Proposal) -> None:
        if proposal.id in self._proposals:
            raise StoreError(f"a proposal with id {proposal.id!r} exists")
        self._proposals[proposal.id] = (tenant, proposal)

    async def get_proposal(self, tenant: str, proposal_id: str) -> Proposal | None:
        owner, proposal = self._proposals.get(proposal_id, (None, None))
        return proposal if owner == tenant else None

    async def list_proposals(
        self, tenant: str, *, states: Collection[ProposalState] | None = None, limit: int = 100
    ) -> list[Proposal]:
        found = [
            p
            for owner, p in reversed(self._proposals.values())
            if owner == tenant and (states is None or p.state in states)
        ]
        return found[: max(limit, 0)]

    async def replace_proposal(self, tenant: str, proposal: Proposal) -> bool:
        current = await self.get_proposal(tenant, proposal.id)
        if current is None or current.version != proposal.version - 1:
            return False
        self._proposals[proposal.id] = (tenant, proposal)
        return True

    async def expired_proposals(self, now: datetime) -> list[tuple[str, Proposal]]:
        return [
            (tenant, p)
            for tenant, p in self._proposals.values()
            if p.state is ProposalState.PENDING and p.expires_at < now
        ]

    async def unfinished_proposals(self) -> list[tuple[str, Proposal]]:
        running = (ProposalState.APPROVED, ProposalState.EXECUTING)
        return [(tenant, p) for tenant, p in self._proposals.values() if p.state in running]

    async def aclose(self) -> None:
        pass


def _audit_matches(query: AuditQuery, record: AuditRecord) -> bool:
    """Whether ``record`` is one ``query`` asks for (``after_seq`` and ``limit`` aside)."""
    action = query.action
    return (
        (query.tenant is None or record.tenant == query.tenant)
        and (query.actor is None or record.actor == query.actor)
        and (query.target is None or record.target == query.target)
        and (
            action is None
            or record.action == action
            or (action.endswith(".") and record.action.startswith(action))
        )
        and (query.since is None or record.at >= timestamp(query.since))
        and (query.until is None or record.at < timestamp(query.until))
    )


def _lost(sandbox: Sandbox, error: str, frozen_error: str | None) -> str | None:
    """Why ``sandbox`` died with its replica (None: it did not): running, or paused
    holding its memory (frozen), when ``frozen_error`` is given."""
    if sandbox.state is SandboxState.RUNNING:
        return error
    if sandbox.state is SandboxState.PAUSED and sandbox.memory and frozen_error is not None:
        return frozen_error
    return None
