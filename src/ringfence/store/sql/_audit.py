"""The audit chain in SQL: the ``audit`` table, appended to in turns."""

from __future__ import annotations

import json

import sqlalchemy as sa

from ringfence.audit.chain import GENESIS, AuditEvent, AuditRecord, Sign, chain, timestamp
from ringfence.errors import StoreError
from ringfence.models import AuditQuery
from ringfence.store.sql._base import SqlBase
from ringfence.store.sql._schema import AUDIT, AUDIT_LOCK_KEY

__all__ = ["SqlAudit"]


class SqlAudit(SqlBase):
    """The audit methods of ``SqlStore``."""

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
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_LOCK_KEY}
                )
            head = (
                await connection.execute(
                    sa.select(AUDIT.c.seq, AUDIT.c.hash).order_by(AUDIT.c.seq.desc()).limit(1)
                )
            ).one_or_none()
            records = chain(events, head.seq if head else 0, head.hash if head else GENESIS, sign)
            await connection.execute(
                AUDIT.insert(),
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
        select = sa.select(AUDIT.c.seq, AUDIT.c.record).where(AUDIT.c.seq > query.after_seq)
        for column, value in (
            (AUDIT.c.tenant, query.tenant),
            (AUDIT.c.actor, query.actor),
            (AUDIT.c.target, query.target),
        ):
            if value is not None:
                select = select.where(column == value)
        if query.action is not None:
            if query.action.endswith("."):
                select = select.where(AUDIT.c.action.startswith(query.action, autoescape=True))
            else:
                select = select.where(AUDIT.c.action == query.action)
        if query.since is not None:
            select = select.where(AUDIT.c.at >= timestamp(query.since))
        if query.until is not None:
            select = select.where(AUDIT.c.at < timestamp(query.until))
        select = select.order_by(AUDIT.c.seq).limit(max(query.limit, 0))
        async with self._transaction("reading the audit log") as connection:
            rows = (await connection.execute(select)).all()
        records = []
        for row in rows:
            try:
                records.append(AuditRecord.from_json(json.loads(row.record)))
            except ValueError as exc:
                raise StoreError(f"{self._name}: audit record {row.seq} cannot be read") from exc
        return records
