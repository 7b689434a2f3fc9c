"""``SqlStore``: the store in SQLite (the default: one file) or PostgreSQL (several replicas).

SQLAlchemy Core over async drivers (aiosqlite, psycopg 3). The schema belongs to the Alembic
migrations in ``migrations/``; ``SqlStore.open`` applies them before it returns. Requests and
results are kept as the JSON of their models, with the status copied beside them for filtering.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from alembic.util import CommandError
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ringfence.audit.chain import GENESIS, AuditEvent, AuditRecord, Sign, chain, timestamp
from ringfence.errors import DuplicateExecution, ExecutionNotFound, SandboxNotFound, StoreError
from ringfence.models import (
    ApiKey,
    AuditQuery,
    ExecutionRecord,
    ExecutionRequest,
    ExecutionResult,
    Proposal,
    ProposalState,
    Role,
    Sandbox,
    SandboxState,
    Status,
)
from ringfence.store import migrations
from ringfence.store._replica import Lease

__all__ = ["SqlStore", "sqlite_url"]


class _Driver(NamedTuple):
    name: str  # the async driver the store runs on
    extra: str  # the extra of ringfence that installs it
    sync: str  # the driver the migrations run on (see SqlStore._migrate)


_DRIVERS = {
    "sqlite": _Driver("aiosqlite", "server", "pysqlite"),
    "postgresql": _Driver("psycopg", "postgres", "psycopg"),
}
_SQLITE_BUSY_TIMEOUT = 30.0  # seconds a writer waits for another before "database is locked"
_POSTGRES_CONNECT_TIMEOUT = 10  # seconds
_UNFINISHED = [status.value for status in Status if not status.is_terminal]


class _UtcDateTime(sa.TypeDecorator[datetime]):
    """An aware datetime, stored in UTC. SQLite keeps no zone: its values come back naive."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError(f"a naive datetime cannot be stored: {value}")
        return None if value is None else value.astimezone(UTC)

    def process_result_value(self, value: Any | None, dialect: Dialect) -> datetime | None:
        if not isinstance(value, datetime):
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# The schema as the queries see it. The migrations create it; a test checks that they agree.
METADATA = sa.MetaData()
_keys = sa.Table(
    "keys",
    METADATA,
    sa.Column("key_id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("secret_hash", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("created_at", _UtcDateTime, nullable=False),
    sa.Column("name", sa.Text, nullable=False, server_default=""),
    sa.Column("revoked_at", _UtcDateTime, nullable=True),
    sa.Column("rotated_at", _UtcDateTime, nullable=True),
)
_executions = sa.Table(
    "executions",
    METADATA,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("request", sa.Text, nullable=False),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("created_at", _UtcDateTime, nullable=False),
    sa.Column("updated_at", _UtcDateTime, nullable=False),
    sa.Column("owner", sa.BigInteger, nullable=True),  # the replica running it
    sa.Index("executions_seq", "seq", unique=True),
    sa.Index("executions_tenant_seq", "tenant", "seq"),
    sa.Index("executions_status", "status"),
)
_sandboxes = sa.Table(
    "sandboxes",
    METADATA,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("record", sa.Text, nullable=False),
    sa.Column("created_at", _UtcDateTime, nullable=False),
    sa.Column("updated_at", _UtcDateTime, nullable=False),
    sa.Column("owner", sa.BigInteger, nullable=True),  # the replica running it
    sa.Index("sandboxes_seq", "seq", unique=True),
    sa.Index("sandboxes_tenant_seq", "tenant", "seq"),
    sa.Index("sandboxes_state", "state"),
)
_audit = sa.Table(
    "audit",
    METADATA,
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("at", sa.Text, nullable=False),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("hash", sa.Text, nullable=False),
    sa.Column("record", sa.Text, nullable=False),
    sa.Index("audit_tenant_seq", "tenant", "seq"),
    sa.Index("audit_at", "at"),
)
_proposals = sa.Table(
    "proposals",
    METADATA,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("expires_at", _UtcDateTime, nullable=False),
    sa.Column("record", sa.Text, nullable=False),
    sa.Column("owner", sa.BigInteger, nullable=True),  # the replica running it
    sa.Index("proposals_seq", "seq", unique=True),
    sa.Index("proposals_tenant_seq", "tenant", "seq"),
    sa.Index("proposals_state_expires", "state", "expires_at"),
)
_NEXT_PROPOSAL_SEQ = sa.select(
    sa.func.coalesce(sa.func.max(_proposals.c.seq), 0) + 1
).scalar_subquery()
# Key of the PostgreSQL advisory lock that makes appends to the audit chain take turns.
_AUDIT_LOCK_KEY = 0x72662D6175646974  # "rf-audit"
# SQLite has no identity columns (it numbers only an INTEGER PRIMARY KEY, and the key here is
# (tenant, id)), so an insert numbers its row itself. It cannot race: every SQLite transaction
# holds the write lock from its start (see _sqlite_begin).
_NEXT_SEQ = sa.select(sa.func.coalesce(sa.func.max(_executions.c.seq), 0) + 1).scalar_subquery()
_NEXT_SANDBOX_SEQ = sa.select(
    sa.func.coalesce(sa.func.max(_sandboxes.c.seq), 0) + 1
).scalar_subquery()


def sqlite_url(data_dir: Path) -> str:
    """The URL of the default store: the file ``ringfence.db`` in ``data_dir``."""
    path = data_dir.absolute() / "ringfence.db"
    return URL.create("sqlite+aiosqlite", database=str(path)).render_as_string()


class SqlStore:
    """The ``Store`` in a SQL database. Get one with ``await SqlStore.open(url)``.

    Safe to use from several tasks of one event loop, and from several processes or
    control-plane replicas on one database. ``aclose`` closes its connections.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        """Wrap ``engine``, whose database must already have the current schema."""
        self._engine = engine
        self._name = engine.url.render_as_string(hide_password=True)
        self._lease = Lease.unlocked()

    @property
    def replica(self) -> int:
        """This store's replica id, stamped on what it runs (see ``_replica``)."""
        return self._lease.replica

    @classmethod
    async def open(cls, url: str | URL) -> SqlStore:
        """Connect to the database at ``url``, bring its schema up to date, return the store.

        ``url`` is a SQLAlchemy URL, ``sqlite:///PATH`` (see ``sqlite_url``) or
        ``postgresql://USER:PASSWORD@HOST/DATABASE``; without a driver in it, the async one
        is chosen (aiosqlite, psycopg). A SQLite file and its directory are created when
        missing, readable by this user only.

        Raises:
            StoreError: the URL names no supported database, its driver is not installed,
                the database cannot be reached or created, or a newer Ringfence migrated it.
        """
        engine = _create_engine(_parse(url))
        store = cls(engine)
        try:
            await store._migrate()
            with store._translated("taking a replica id"):
                store._lease = await Lease.take(engine)
        except BaseException:
            await engine.dispose()
            raise
        return store

    async def _migrate(self) -> None:
        # Alembic is synchronous, and keeps the migration it runs in module globals (alembic.op,
        # alembic.context). Run through this engine's run_sync, two stores opening at once in
        # one event loop would interleave there and mix their migrations up. So it runs in a
        # worker thread, on a short-lived sync engine of the same driver and settings, where a
        # plain lock in ``migrations.upgrade`` keeps one migration at a time in this process.
        try:
            with self._translated("migrating the schema"):
                await asyncio.to_thread(_migrate, self._engine.url)
        except CommandError as exc:
            raise StoreError(
                f"{self._name}: its schema is at a revision this Ringfence does not know "
                f"(a newer version migrated it?): {exc}"
            ) from exc

    async def add_key(self, key: ApiKey) -> None:
        """Store a new key.

        Raises:
            StoreError: a key with its ``key_id`` exists, or the database failed.
        """
        insert = _keys.insert().values(
            key_id=key.key_id,
            tenant=key.tenant,
            role=key.role.value,
            secret_hash=key.secret_hash,
            description=key.description,
            created_at=key.created_at,
            name=key.name,
            revoked_at=key.revoked_at,
            rotated_at=key.rotated_at,
        )
        async with self._transaction("adding a key") as connection:
            try:
                await connection.execute(insert)
            except IntegrityError as exc:
                raise StoreError(f"a key with id {key.key_id!r} exists") from exc

    async def get_key(self, key_id: str) -> ApiKey | None:
        """The key with this id, or None.

        Raises:
            StoreError: the database failed.
        """
        query = sa.select(_keys).where(_keys.c.key_id == key_id)
        async with self._transaction("reading a key") as connection:
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else self._key(row)

    async def count_keys(self) -> int:
        """How many keys exist, in every tenant.

        Raises:
            StoreError: the database failed.
        """
        query = sa.select(sa.func.count()).select_from(_keys)
        async with self._transaction("counting keys") as connection:
            count: int = (await connection.execute(query)).scalar_one()
        return count

    async def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        """The keys of ``tenant`` (None: every tenant's), oldest first.

        Raises:
            StoreError: the database failed.
        """
        query = sa.select(_keys).order_by(_keys.c.created_at, _keys.c.key_id)
        if tenant is not None:
            query = query.where(_keys.c.tenant == tenant)
        async with self._transaction("listing keys") as connection:
            rows = (await connection.execute(query)).all()
        return [self._key(row) for row in rows]

    async def revoke_key(self, key_id: str, at: datetime) -> ApiKey | None:
        """Mark the key revoked (once: the first time stays) and return it.

        Raises:
            StoreError: the database failed.
        """
        update = (
            _keys.update()
            .where(_keys.c.key_id == key_id, _keys.c.revoked_at.is_(None))
            .values(revoked_at=at)
        )
        query = sa.select(_keys).where(_keys.c.key_id == key_id)
        async with self._transaction("revoking a key") as connection:
            await connection.execute(update)
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else self._key(row)

    async def rotate_key(self, key_id: str, secret_hash: str, at: datetime) -> ApiKey | None:
        """Replace the digest of a key not revoked, and return it; None if none changed.

        Raises:
            StoreError: the database failed.
        """
        update = (
            _keys.update()
            .where(_keys.c.key_id == key_id, _keys.c.revoked_at.is_(None))
            .values(secret_hash=secret_hash, rotated_at=at)
        )
        query = sa.select(_keys).where(_keys.c.key_id == key_id)
        async with self._transaction("rotating a key") as connection:
            if (await connection.execute(update)).rowcount != 1:
                return None
            row = (await connection.execute(query)).one()
        return self._key(row)

    async def add_execution(
        self, tenant: str, request: ExecutionRequest, result: ExecutionResult
    ) -> ExecutionRecord:
        """Record a new execution under ``(tenant, request.id)``.

        Raises:
            DuplicateExecution: the tenant already has an execution with this id.
            StoreError: the database failed.
        """
        now = datetime.now(UTC)
        insert = _executions.insert().values(
            tenant=tenant,
            id=request.id,
            status=result.status.value,
            request=request.model_dump_json(),
            result=result.model_dump_json(),
            created_at=now,
            updated_at=now,
            owner=self.replica,
        )
        if self._engine.dialect.name == "sqlite":
            insert = insert.values(seq=_NEXT_SEQ)
        async with self._transaction("adding an execution") as connection:
            try:
                await connection.execute(insert)
            except IntegrityError as exc:
                raise DuplicateExecution(
                    f"an execution with id {request.id!r} already exists"
                ) from exc
        return ExecutionRecord(tenant, request.id, request, result, now, now)

    async def update_execution(
        self, tenant: str, execution_id: str, result: ExecutionResult
    ) -> None:
        """Replace the stored result.

        Raises:
            ExecutionNotFound: no such execution in this tenant.
            StoreError: the database failed.
        """
        async with self._transaction("updating an execution") as connection:
            updated = await connection.execute(
                _set_result(tenant, execution_id, result, datetime.now(UTC))
            )
            if updated.rowcount == 0:
                raise ExecutionNotFound(f"no execution with id {execution_id!r}")

    async def get_execution(self, tenant: str, execution_id: str) -> ExecutionRecord | None:
        """The execution, or None (also when it belongs to another tenant).

        Raises:
            StoreError: the database failed, or the stored execution cannot be read.
        """
        query = sa.select(_executions).where(
            _executions.c.tenant == tenant, _executions.c.id == execution_id
        )
        async with self._transaction("reading an execution") as connection:
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else self._record(row)

    async def list_executions(
        self, tenant: str, *, status: Status | None = None, limit: int = 100
    ) -> list[ExecutionRecord]:
        """The tenant's executions, newest first, optionally of one status.

        Raises:
            StoreError: the database failed, or a stored execution cannot be read.
        """
        query = sa.select(_executions).where(_executions.c.tenant == tenant)
        if status is not None:
            query = query.where(_executions.c.status == status.value)
        query = query.order_by(_executions.c.seq.desc()).limit(max(limit, 0))
        async with self._transaction("listing executions") as connection:
            rows = (await connection.execute(query)).all()
        return [self._record(row) for row in rows]

    async def fail_unfinished(self, error: str) -> list[ExecutionRecord]:
        """Mark every execution that is not terminal as ``failed`` with ``error``; return them.

        Raises:
            StoreError: the database failed, or a stored execution cannot be read.
        """
        query = (
            sa.select(_executions)
            .where(_executions.c.status.in_(_UNFINISHED), self._gone(_executions.c.owner))
            .order_by(_executions.c.seq)
            .with_for_update()
        )
        failed = []
        async with self._transaction("failing unfinished executions") as connection:
            now = datetime.now(UTC)
            for row in (await connection.execute(query)).all():
                record = self._record(row)
                result = record.result.model_copy(
                    update={"status": Status.FAILED, "error": error, "finished_at": now}
                )
                await connection.execute(_set_result(record.tenant, record.id, result, now))
                failed.append(dataclasses.replace(record, result=result, updated_at=now))
        return failed

    async def add_sandbox(self, tenant: str, sandbox: Sandbox) -> None:
        """Record a new sandbox.

        Raises:
            StoreError: a sandbox with its id exists, or the database failed.
        """
        now = datetime.now(UTC)
        insert = _sandboxes.insert().values(
            id=sandbox.id,
            tenant=tenant,
            state=sandbox.state.value,
            record=sandbox.model_dump_json(),
            created_at=now,
            updated_at=now,
            owner=self.replica,
        )
        if self._engine.dialect.name == "sqlite":
            insert = insert.values(seq=_NEXT_SANDBOX_SEQ)
        async with self._transaction("adding a sandbox") as connection:
            try:
                await connection.execute(insert)
            except IntegrityError as exc:
                raise StoreError(f"a sandbox with id {sandbox.id!r} exists") from exc

    async def update_sandbox(self, tenant: str, sandbox: Sandbox) -> None:
        """Replace the stored sandbox.

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
            StoreError: the database failed.
        """
        async with self._transaction("updating a sandbox") as connection:
            updated = await connection.execute(_set_sandbox(tenant, sandbox, datetime.now(UTC)))
            if updated.rowcount == 0:
                raise SandboxNotFound(f"no sandbox with id {sandbox.id!r}")

    async def get_sandbox(self, tenant: str, sandbox_id: str) -> Sandbox | None:
        """The sandbox, or None (also when it belongs to another tenant).

        Raises:
            StoreError: the database failed, or the stored sandbox cannot be read.
        """
        query = sa.select(_sandboxes).where(
            _sandboxes.c.tenant == tenant, _sandboxes.c.id == sandbox_id
        )
        async with self._transaction("reading a sandbox") as connection:
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else self._sandbox(row)

    async def list_sandboxes(
        self,
        tenant: str,
        *,
        states: Collection[SandboxState] | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 100,
    ) -> list[Sandbox]:
        """The tenant's sandboxes, newest first, filtered by state and metadata.

        Metadata is compared here, not in SQL (JSON operators differ between SQLite and
        PostgreSQL), over the tenant's sandboxes in the wanted states.

        Raises:
            StoreError: the database failed, or a stored sandbox cannot be read.
        """
        query = sa.select(_sandboxes).where(_sandboxes.c.tenant == tenant)
        if states is not None:
            query = query.where(_sandboxes.c.state.in_([state.value for state in states]))
        query = query.order_by(_sandboxes.c.seq.desc())
        if not metadata:
            query = query.limit(limit)
        wanted = (metadata or {}).items()
        found: list[Sandbox] = []
        if limit <= 0:
            return found
        async with self._transaction("listing sandboxes") as connection:
            async for row in await connection.stream(query):
                sandbox = self._sandbox(row)
                if wanted <= sandbox.metadata.items():
                    found.append(sandbox)
                    if len(found) >= limit:
                        break
        return found

    async def end_running_sandboxes(self, error: str) -> list[tuple[str, Sandbox]]:
        """Mark every running sandbox ``failed`` with ``error``; return them, updated.

        Raises:
            StoreError: the database failed, or a stored sandbox cannot be read.
        """
        query = (
            sa.select(_sandboxes)
            .where(_sandboxes.c.state == SandboxState.RUNNING.value, self._gone(_sandboxes.c.owner))
            .order_by(_sandboxes.c.seq)
            .with_for_update()
        )
        ended = []
        async with self._transaction("ending running sandboxes") as connection:
            now = datetime.now(UTC)
            for row in (await connection.execute(query)).all():
                sandbox = self._sandbox(row).ended(SandboxState.FAILED, error)
                await connection.execute(_set_sandbox(row.tenant, sandbox, now))
                ended.append((row.tenant, sandbox))
        return ended

    async def append_audit(
        self, events: list[AuditEvent], sign: Sign | None = None
    ) -> list[AuditRecord]:
        """Append ``events`` after the chain's last record, in one transaction.

        Appenders take turns: SQLite's transactions hold the write lock from their start;
        on PostgreSQL an advisory lock is taken first, so the last record read is still the
        last one at the insert, across processes and replicas.

        Raises:
            StoreError: the database failed.
        """
        if not events:
            return []
        async with self._transaction("appending to the audit log") as connection:
            if self._engine.dialect.name == "postgresql":
                await connection.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _AUDIT_LOCK_KEY}
                )
            head = (
                await connection.execute(
                    sa.select(_audit.c.seq, _audit.c.hash).order_by(_audit.c.seq.desc()).limit(1)
                )
            ).one_or_none()
            records = chain(events, head.seq if head else 0, head.hash if head else GENESIS, sign)
            await connection.execute(
                _audit.insert(),
                [
                    {
                        "seq": r.seq, "at": r.at, "tenant": r.tenant, "actor": r.actor,
                        "action": r.action, "target": r.target, "hash": r.hash,
                        "record": r.line(),
                    }
                    for r in records
                ],
            )  # fmt: skip
        return records

    async def list_audit(self, query: AuditQuery) -> list[AuditRecord]:
        """Audit records matching ``query``, oldest first.

        Raises:
            StoreError: the database failed, or a stored record cannot be read.
        """
        select = sa.select(_audit.c.seq, _audit.c.record).where(_audit.c.seq > query.after_seq)
        for column, value in (
            (_audit.c.tenant, query.tenant),
            (_audit.c.actor, query.actor),
            (_audit.c.target, query.target),
        ):
            if value is not None:
                select = select.where(column == value)
        if query.action is not None:
            if query.action.endswith("."):
                select = select.where(_audit.c.action.startswith(query.action, autoescape=True))
            else:
                select = select.where(_audit.c.action == query.action)
        if query.since is not None:
            select = select.where(_audit.c.at >= timestamp(query.since))
        if query.until is not None:
            select = select.where(_audit.c.at < timestamp(query.until))
        select = select.order_by(_audit.c.seq).limit(max(query.limit, 0))
        async with self._transaction("reading the audit log") as connection:
            rows = (await connection.execute(select)).all()
        records = []
        for row in rows:
            try:
                records.append(AuditRecord.from_json(json.loads(row.record)))
            except ValueError as exc:
                raise StoreError(f"{self._name}: audit record {row.seq} cannot be read") from exc
        return records

    async def add_proposal(self, tenant: str, proposal: Proposal) -> None:
        """Record a new proposal.

        Raises:
            StoreError: a proposal with its id exists, or the database failed.
        """
        insert = _proposals.insert().values(
            id=proposal.id,
            tenant=tenant,
            state=proposal.state.value,
            version=proposal.version,
            expires_at=proposal.expires_at,
            record=_proposal_record(proposal),
            owner=self.replica,
        )
        if self._engine.dialect.name == "sqlite":
            insert = insert.values(seq=_NEXT_PROPOSAL_SEQ)
        async with self._transaction("adding a proposal") as connection:
            try:
                await connection.execute(insert)
            except IntegrityError as exc:
                raise StoreError(f"a proposal with id {proposal.id!r} exists") from exc

    async def get_proposal(self, tenant: str, proposal_id: str) -> Proposal | None:
        """The proposal, or None (also when it belongs to another tenant).

        Raises:
            StoreError: the database failed, or the stored proposal cannot be read.
        """
        query = sa.select(_proposals).where(
            _proposals.c.tenant == tenant, _proposals.c.id == proposal_id
        )
        async with self._transaction("reading a proposal") as connection:
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else self._proposal(row)

    async def list_proposals(
        self, tenant: str, *, states: Collection[ProposalState] | None = None, limit: int = 100
    ) -> list[Proposal]:
        """The tenant's proposals, newest first.

        Raises:
            StoreError: the database failed, or a stored proposal cannot be read.
        """
        query = sa.select(_proposals).where(_proposals.c.tenant == tenant)
        if states is not None:
            query = query.where(_proposals.c.state.in_([state.value for state in states]))
        query = query.order_by(_proposals.c.seq.desc()).limit(max(limit, 0))
        async with self._transaction("listing proposals") as connection:
            rows = (await connection.execute(query)).all()
        return [self._proposal(row) for row in rows]

    async def replace_proposal(self, tenant: str, proposal: Proposal) -> bool:
        """Store ``proposal`` if the stored one is still at ``proposal.version - 1``.

        Raises:
            StoreError: the database failed.
        """
        update = (
            _proposals.update()
            .where(
                _proposals.c.tenant == tenant,
                _proposals.c.id == proposal.id,
                _proposals.c.version == proposal.version - 1,
            )
            .values(
                state=proposal.state.value,
                version=proposal.version,
                expires_at=proposal.expires_at,
                record=_proposal_record(proposal),
                owner=self.replica,  # the replica that changes it runs what follows
            )
        )
        async with self._transaction("updating a proposal") as connection:
            updated = await connection.execute(update)
        return bool(updated.rowcount == 1)

    async def expired_proposals(self, now: datetime) -> list[tuple[str, Proposal]]:
        """Pending proposals whose approval window closed before ``now``.

        Raises:
            StoreError: the database failed, or a stored proposal cannot be read.
        """
        query = (
            sa.select(_proposals)
            .where(
                _proposals.c.state == ProposalState.PENDING.value,
                _proposals.c.expires_at < now,
            )
            .order_by(_proposals.c.seq)
        )
        async with self._transaction("finding expired proposals") as connection:
            rows = (await connection.execute(query)).all()
        return [(row.tenant, self._proposal(row)) for row in rows]

    async def unfinished_proposals(self) -> list[tuple[str, Proposal]]:
        """Proposals ``approved`` or ``executing``.

        Raises:
            StoreError: the database failed, or a stored proposal cannot be read.
        """
        running = [ProposalState.APPROVED.value, ProposalState.EXECUTING.value]
        query = sa.select(_proposals).where(
            _proposals.c.state.in_(running), self._gone(_proposals.c.owner)
        )
        async with self._transaction("finding unfinished proposals") as connection:
            rows = (await connection.execute(query.order_by(_proposals.c.seq))).all()
        return [(row.tenant, self._proposal(row)) for row in rows]

    async def aclose(self) -> None:
        """Close every connection (and so end this replica's lease)."""
        try:
            with self._translated("ending the replica's lease"):
                await self._lease.release()
        finally:
            await self._engine.dispose()

    def _gone(self, owner: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
        return self._lease.gone(owner, self._engine.dialect.name)

    @contextlib.asynccontextmanager
    async def _transaction(self, doing: str) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction, committed at the end; database errors as StoreError."""
        with self._translated(doing):
            async with self._engine.begin() as connection:
                yield connection

    @contextlib.contextmanager
    def _translated(self, doing: str) -> Iterator[None]:
        try:
            yield
        except SQLAlchemyError as exc:
            raise StoreError(f"{self._name}: {doing} failed: {self._reason(exc)}") from exc

    def _reason(self, exc: SQLAlchemyError) -> str:
        # The driver's own message: SQLAlchemy's adds the statement and its parameters.
        cause = exc.orig if isinstance(exc, StatementError) and exc.orig else exc
        reason = " ".join(str(cause).split())
        password = self._engine.url.password
        return reason.replace(password, "***") if password else reason

    def _key(self, row: sa.Row[Any]) -> ApiKey:
        try:
            role = Role(row.role)
        except ValueError as exc:
            raise StoreError(f"{self._name}: key {row.key_id!r} has an unknown role") from exc
        return ApiKey(
            row.key_id, row.tenant, role, row.secret_hash, row.created_at, row.description,
            row.name, row.revoked_at, row.rotated_at,
        )  # fmt: skip

    def _record(self, row: sa.Row[Any]) -> ExecutionRecord:
        try:
            request = ExecutionRequest.model_validate_json(row.request)
            result = ExecutionResult.model_validate_json(row.result)
        except ValueError as exc:  # pydantic's ValidationError is one
            raise StoreError(
                f"{self._name}: execution {row.id!r} of {row.tenant!r} cannot be read: {exc}"
            ) from exc
        return ExecutionRecord(row.tenant, row.id, request, result, row.created_at, row.updated_at)

    def _proposal(self, row: sa.Row[Any]) -> Proposal:
        try:
            return Proposal.model_validate_json(row.record)
        except ValueError as exc:
            raise StoreError(
                f"{self._name}: proposal {row.id!r} of {row.tenant!r} cannot be read: {exc}"
            ) from exc

    def _sandbox(self, row: sa.Row[Any]) -> Sandbox:
        try:
            return Sandbox.model_validate_json(row.record)
        except ValueError as exc:
            raise StoreError(
                f"{self._name}: sandbox {row.id!r} of {row.tenant!r} cannot be read: {exc}"
            ) from exc


def _set_sandbox(tenant: str, sandbox: Sandbox, now: datetime) -> sa.Update:
    return (
        _sandboxes.update()
        .where(_sandboxes.c.tenant == tenant, _sandboxes.c.id == sandbox.id)
        .values(state=sandbox.state.value, record=sandbox.model_dump_json(), updated_at=now)
    )


def _set_result(
    tenant: str, execution_id: str, result: ExecutionResult, now: datetime
) -> sa.Update:
    return (
        _executions.update()
        .where(_executions.c.tenant == tenant, _executions.c.id == execution_id)
        .values(status=result.status.value, result=result.model_dump_json(), updated_at=now)
    )


def _parse(url: str | URL) -> URL:
    """The URL with its async driver.

    Raises:
        StoreError: the URL cannot be parsed, or names another database or driver.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        # Not chained: an unparsable URL cannot be shown with its password hidden.
        raise StoreError(
            "the store's URL cannot be parsed: expected sqlite:///PATH "
            "or postgresql://USER:PASSWORD@HOST/DATABASE"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in _DRIVERS:
        raise StoreError(f"the store runs on sqlite or postgresql, not {backend!r}")
    driver = f"{backend}+{_DRIVERS[backend].name}"
    if parsed.drivername == backend:
        return parsed.set(drivername=driver)
    if parsed.drivername != driver:
        raise StoreError(f"the store needs the driver {driver}, not {parsed.drivername}")
    return parsed


def _create_engine(url: URL) -> AsyncEngine:
    """An engine for ``url``; for a SQLite file, the file is created first.

    Raises:
        StoreError: the driver is not installed, or the SQLite file cannot be created.
    """
    driver = _DRIVERS[url.get_backend_name()]
    if url.get_backend_name() == "sqlite":
        _create_private_file(url)
    try:
        engine = create_async_engine(url, connect_args=_connect_args(url), **_pool_options(url))
    except ImportError as exc:
        raise StoreError(
            f"the store needs the {driver.name} package: pip install 'ringfence[{driver.extra}]'"
        ) from exc
    _configure(engine.sync_engine)
    return engine


def _proposal_record(proposal: Proposal) -> str:
    """The proposal as stored: with its sealed credentials, which no dump carries."""
    record = proposal.model_dump(mode="json")
    if proposal.sealed_credentials is not None:
        record["sealed_credentials"] = proposal.sealed_credentials
    return json.dumps(record, separators=(",", ":"))


def _migrate(url: URL) -> None:
    """Bring the schema of the database at ``url`` (an async driver's) up to date.

    Raises:
        alembic.util.CommandError: a newer Ringfence migrated it.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    backend = url.get_backend_name()
    sync_url = url.set(drivername=f"{backend}+{_DRIVERS[backend].sync}")
    engine = sa.create_engine(sync_url, connect_args=_connect_args(url), poolclass=sa.NullPool)
    _configure(engine)
    try:
        with engine.begin() as connection:
            migrations.upgrade(connection)
    finally:
        engine.dispose()


def _connect_args(url: URL) -> dict[str, Any]:
    """The driver's timeouts, unless the URL's query string sets them itself."""
    if url.get_backend_name() == "postgresql":
        defaults: dict[str, Any] = {"connect_timeout": _POSTGRES_CONNECT_TIMEOUT}
    else:
        defaults = {"timeout": _SQLITE_BUSY_TIMEOUT}
    return {name: value for name, value in defaults.items() if name not in url.query}


def _pool_options(url: URL) -> dict[str, Any]:
    if url.get_backend_name() == "postgresql":
        return {"pool_pre_ping": True}  # a connection may have died with a server restart
    # SQLite lets one writer in at a time, and every transaction here writes (BEGIN
    # IMMEDIATE). With one connection, this process's tasks queue for it in the pool instead
    # of polling the file lock; other processes still wait up to the busy timeout.
    return {"pool_size": 1, "max_overflow": 0}


def _configure(engine: sa.Engine) -> None:
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_connect)
        sa.event.listen(engine, "begin", _sqlite_begin)


def _create_private_file(url: URL) -> None:
    """Create the SQLite file, and its directory, for this user's eyes only (keys' hashes
    live there). SQLite gives its -wal and -shm files the permissions of the database file.

    Raises:
        StoreError: they cannot be created.
    """
    if not url.database or url.database == ":memory:" or url.query.get("uri"):
        return
    path = Path(url.database)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except OSError as exc:
        raise StoreError(f"cannot create the SQLite database {path}: {exc.strerror}") from exc


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # sqlite3 begins transactions by itself only before INSERT, UPDATE and DELETE, leaving
    # reads and DDL outside them. Turn that off: _sqlite_begin begins every transaction.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # WAL: a reader elsewhere (a backup, the sqlite3 shell) and our writer do not block each
    # other, and a commit appends to one file.
    cursor.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL syncs at checkpoints, not at every commit: a commit survives a crash
    # of the server (SIGKILL included) and only a power loss may take the last ones back.
    # FULL's fsync per commit measured up to 30 ms here, on the path of every sandbox create.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(connection: sa.Connection) -> None:
    # Take the write lock at once, waiting up to the busy timeout. A deferred transaction
    # that reads and then writes fails at once with "database is locked" when another
    # process wrote in between; and two processes migrating at once serialise on this lock.
    connection.exec_driver_sql("BEGIN IMMEDIATE")
