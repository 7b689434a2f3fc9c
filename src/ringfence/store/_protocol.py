"""The store: what the control plane remembers across restarts.

It keeps API keys (each bound to a tenant and a role), executions (the request as
submitted and the latest result), interactive sandboxes (as the API shows them) and the
snapshots tenants keep of them (their records: the files are on the server's disk), and
tenants' volumes (their records: the files are on the server's disk too).
Everything is scoped by tenant: no method returns another tenant's objects.
Implementations: ``MemoryStore`` (tests, and a server that may forget) and ``SqlStore``
(SQLite by default, PostgreSQL for several replicas).

Several replicas: each store instance is one replica, and what it runs (executions,
sandboxes, proposals being executed) is known only to its process. So the start-up sweeps
(``fail_unfinished``, ``end_running_sandboxes``, ``unfinished_proposals``) take only what
replicas that are gone left behind; a store only one process can use (memory, SQLite) has
no other replica, and its sweeps take everything unfinished.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Protocol

from ringfence.audit.chain import AuditEvent, AuditRecord, Sign
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

__all__ = ["Store"]


class Store(Protocol):
    """Persistent state of the control plane.

    Called by the service layer only. Methods are safe to call concurrently from one event
    loop. Errors that may escape: ``DuplicateExecution`` from ``add_execution``,
    ``ExecutionNotFound`` from ``update_execution``; storage failures as ``StoreError``.
    ``aclose`` releases connections; nothing else needs cleaning up.
    """

    async def add_key(self, key: ApiKey) -> None:
        """Store a new key. Raises ``StoreError`` if its ``key_id`` exists."""
        ...

    async def get_key(self, key_id: str) -> ApiKey | None:
        """The key with this id, or None."""
        ...

    async def count_keys(self) -> int:
        """How many keys exist, in every tenant (0 means a fresh data directory)."""
        ...

    async def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        """The keys of ``tenant`` (None: of every tenant), revoked ones included, oldest first."""
        ...

    async def revoke_key(self, key_id: str, at: datetime) -> ApiKey | None:
        """Mark the key revoked at ``at`` (a key revoked already keeps its first time) and
        return it as stored now; None when no key has this id."""
        ...

    async def rotate_key(self, key_id: str, secret_hash: str, at: datetime) -> ApiKey | None:
        """Replace the digest of a key that is not revoked and return it as stored now;
        None when no key has this id or it is revoked (nothing changes then)."""
        ...

    async def add_execution(
        self, tenant: str, request: ExecutionRequest, result: ExecutionResult
    ) -> ExecutionRecord:
        """Record a new execution under ``(tenant, request.id)``.

        Raises:
            DuplicateExecution: the tenant already has an execution with this id.
        """
        ...

    async def update_execution(
        self, tenant: str, execution_id: str, result: ExecutionResult
    ) -> None:
        """Replace the stored result.

        Raises:
            ExecutionNotFound: no such execution in this tenant.
        """
        ...

    async def get_execution(self, tenant: str, execution_id: str) -> ExecutionRecord | None:
        """The execution, or None (also when it belongs to another tenant)."""
        ...

    async def list_executions(
        self, tenant: str, *, status: Status | None = None, limit: int = 100
    ) -> list[ExecutionRecord]:
        """The tenant's executions, newest first, optionally of one status."""
        ...

    async def fail_unfinished(self, error: str) -> list[ExecutionRecord]:
        """At start-up: mark ``failed`` with ``error`` every execution that is not terminal
        and whose replica is gone (restarted or dead: it lost them); return them as updated.
        What a live replica runs is left alone, and of two replicas starting at once, each
        execution is failed by one."""
        ...

    async def add_sandbox(self, tenant: str, sandbox: Sandbox) -> None:
        """Record a new sandbox. Raises ``StoreError`` if its id exists (in any tenant)."""
        ...

    async def update_sandbox(self, tenant: str, sandbox: Sandbox) -> None:
        """Replace the stored sandbox.

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
        """
        ...

    async def get_sandbox(self, tenant: str, sandbox_id: str) -> Sandbox | None:
        """The sandbox, or None (also when it belongs to another tenant)."""
        ...

    async def list_sandboxes(
        self,
        tenant: str,
        *,
        states: Collection[SandboxState] | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 100,
    ) -> list[Sandbox]:
        """The tenant's sandboxes, newest first: only those in one of ``states`` (all when
        None) whose metadata has every pair of ``metadata``."""
        ...

    async def end_running_sandboxes(
        self, error: str, frozen_error: str | None = None
    ) -> list[tuple[str, Sandbox]]:
        """At start-up: mark ``failed`` with ``error`` every running sandbox whose replica
        is gone (they died with it), and with ``frozen_error`` (when given) every paused one
        of such a replica that held its memory (``memory`` true: a frozen one's processes
        died with it too); return them as ``(tenant, sandbox)``, updated. A live replica's
        sandboxes, and paused ones kept on disk (``memory`` false), are left alone."""
        ...

    async def add_snapshot(self, tenant: str, snapshot: Snapshot) -> None:
        """Record a new snapshot. Raises ``StoreError`` if its id exists (in any tenant)."""
        ...

    async def get_snapshot(self, tenant: str, snapshot_id: str) -> Snapshot | None:
        """The snapshot, or None (also when it belongs to another tenant)."""
        ...

    async def list_snapshots(self, tenant: str, *, limit: int = 100) -> list[Snapshot]:
        """The tenant's snapshots, newest first."""
        ...

    async def delete_snapshot(self, tenant: str, snapshot_id: str) -> bool:
        """Forget the snapshot; False when the tenant has none with this id."""
        ...

    async def add_volume(self, tenant: str, volume: Volume) -> None:
        """Record a new volume. Raises ``VolumeExists`` if the tenant has one of its name,
        ``StoreError`` if its id exists (in any tenant)."""
        ...

    async def get_volume(
        self, tenant: str, *, id: str | None = None, name: str | None = None
    ) -> Volume | None:
        """The tenant's volume with this id, or with this name (one of them given), or
        None (also when it belongs to another tenant)."""
        ...

    async def list_volumes(self, tenant: str, *, limit: int = 100) -> list[Volume]:
        """The tenant's volumes, newest first."""
        ...

    async def delete_volume(self, tenant: str, volume_id: str) -> bool:
        """Forget the volume; False when the tenant has none with this id."""
        ...

    async def append_audit(
        self, events: list[AuditEvent], sign: Sign | None = None
    ) -> list[AuditRecord]:
        """Append ``events`` to the audit chain, in order, after its current last record, in
        one transaction (appenders in other processes wait their turn); seal events are
        signed with ``sign``. Returns the records as stored."""
        ...

    async def list_audit(self, query: AuditQuery) -> list[AuditRecord]:
        """Audit records matching ``query``, oldest first."""
        ...

    async def add_proposal(self, tenant: str, proposal: Proposal) -> None:
        """Record a new proposal. Raises ``StoreError`` if its id exists."""
        ...

    async def get_proposal(self, tenant: str, proposal_id: str) -> Proposal | None:
        """The proposal, or None (also when it belongs to another tenant)."""
        ...

    async def list_proposals(
        self, tenant: str, *, states: Collection[ProposalState] | None = None, limit: int = 100
    ) -> list[Proposal]:
        """The tenant's proposals, newest first, optionally in some states only."""
        ...

    async def replace_proposal(self, tenant: str, proposal: Proposal) -> bool:
        """Store ``proposal`` if the stored one is still at ``proposal.version - 1``
        (compare-and-set): False when someone else changed it first, or it is not there."""
        ...

    async def expired_proposals(self, now: datetime) -> list[tuple[str, Proposal]]:
        """Every pending proposal whose approval window closed before ``now``, as
        ``(tenant, proposal)``."""
        ...

    async def unfinished_proposals(self) -> list[tuple[str, Proposal]]:
        """Every proposal ``approved`` or ``executing`` by a replica that is gone (never to
        finish), as ``(tenant, proposal)``. A live replica's are left alone."""
        ...

    async def aclose(self) -> None: ...
