"""The schema as the queries see it. The migrations create it; a test checks that they agree."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

__all__ = [
    "AUDIT",
    "AUDIT_LOCK_KEY",
    "EXECUTIONS",
    "KEYS",
    "METADATA",
    "NEXT_EXECUTION_SEQ",
    "NEXT_PROPOSAL_SEQ",
    "NEXT_SANDBOX_SEQ",
    "NEXT_SNAPSHOT_SEQ",
    "NEXT_VOLUME_SEQ",
    "PROPOSALS",
    "SANDBOXES",
    "SNAPSHOTS",
    "VOLUMES",
    "UtcDateTime",
]


class UtcDateTime(sa.TypeDecorator[datetime]):
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


METADATA = sa.MetaData()
KEYS = sa.Table(
    "keys",
    METADATA,
    sa.Column("key_id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("secret_hash", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("name", sa.Text, nullable=False, server_default=""),
    sa.Column("revoked_at", UtcDateTime, nullable=True),
    sa.Column("rotated_at", UtcDateTime, nullable=True),
)
EXECUTIONS = sa.Table(
    "executions",
    METADATA,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("request", sa.Text, nullable=False),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Column("owner", sa.BigInteger, nullable=True),  # the replica running it
    sa.Index("executions_seq", "seq", unique=True),
    sa.Index("executions_tenant_seq", "tenant", "seq"),
    sa.Index("executions_status", "status"),
)
SANDBOXES = sa.Table(
    "sandboxes",
    METADATA,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("record", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Column("owner", sa.BigInteger, nullable=True),  # the replica running it
    sa.Index("sandboxes_seq", "seq", unique=True),
    sa.Index("sandboxes_tenant_seq", "tenant", "seq"),
    sa.Index("sandboxes_state", "state"),
)
SNAPSHOTS = sa.Table(
    "snapshots",
    METADATA,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    sa.Column("record", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("snapshots_seq", "seq", unique=True),
    sa.Index("snapshots_tenant_seq", "tenant", "seq"),
)
VOLUMES = sa.Table(
    "volumes",
    METADATA,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    sa.Column("record", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("volumes_seq", "seq", unique=True),
    sa.Index("volumes_tenant_name", "tenant", "name", unique=True),
)
AUDIT = sa.Table(
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
PROPOSALS = sa.Table(
    "proposals",
    METADATA,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("expires_at", UtcDateTime, nullable=False),
    sa.Column("record", sa.Text, nullable=False),
    sa.Column("owner", sa.BigInteger, nullable=True),  # the replica running it
    sa.Index("proposals_seq", "seq", unique=True),
    sa.Index("proposals_tenant_seq", "tenant", "seq"),
    sa.Index("proposals_state_expires", "state", "expires_at"),
)
NEXT_PROPOSAL_SEQ = sa.select(
    sa.func.coalesce(sa.func.max(PROPOSALS.c.seq), 0) + 1
).scalar_subquery()
# Key of the PostgreSQL advisory lock that makes appends to the audit chain take turns.
AUDIT_LOCK_KEY = 0x72662D6175646974  # "rf-audit"
# SQLite has no identity columns (it numbers only an INTEGER PRIMARY KEY, and the key here is
# (tenant, id)), so an insert numbers its row itself. It cannot race: every SQLite transaction
# holds the write lock from its start (see _engine._sqlite_begin).
NEXT_EXECUTION_SEQ = sa.select(
    sa.func.coalesce(sa.func.max(EXECUTIONS.c.seq), 0) + 1
).scalar_subquery()
NEXT_SANDBOX_SEQ = sa.select(
    sa.func.coalesce(sa.func.max(SANDBOXES.c.seq), 0) + 1
).scalar_subquery()
NEXT_SNAPSHOT_SEQ = sa.select(
    sa.func.coalesce(sa.func.max(SNAPSHOTS.c.seq), 0) + 1
).scalar_subquery()
NEXT_VOLUME_SEQ = sa.select(sa.func.coalesce(sa.func.max(VOLUMES.c.seq), 0) + 1).scalar_subquery()
