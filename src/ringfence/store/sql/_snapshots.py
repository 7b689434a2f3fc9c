"""Snapshots in SQL: the ``snapshots`` table (each record as the API shows it, in JSON)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ringfence.errors import StoreError
from ringfence.models import Snapshot
from ringfence.store.sql._base import SqlBase
from ringfence.store.sql._schema import NEXT_SNAPSHOT_SEQ, SNAPSHOTS

__all__ = ["SqlSnapshots"]


class SqlSnapshots(SqlBase):
    """The snapshot methods of ``SqlStore``."""

    async def add_snapshot(self, tenant: str, snapshot: Snapshot) -> None:
        """Record a new snapshot.

        Raises:
            StoreError: a snapshot with its id exists, or the database failed.
        """
        insert = SNAPSHOTS.insert().values(
            id=snapshot.id,
            tenant=tenant,
            record=snapshot.model_dump_json(),
            created_at=datetime.now(UTC),
        )
        if self._engine.dialect.name == "sqlite":
            insert = insert.values(seq=NEXT_SNAPSHOT_SEQ)
        async with self._transaction("adding a snapshot") as connection:
            try:
                await connection.execute(insert)
            except IntegrityError as exc:
                raise StoreError(f"a snapshot with id {snapshot.id!r} exists") from exc

    async def get_snapshot(self, tenant: str, snapshot_id: str) -> Snapshot | None:
        """The snapshot, or None (also when it belongs to another tenant)."""
        query = sa.select(SNAPSHOTS).where(
            SNAPSHOTS.c.tenant == tenant, SNAPSHOTS.c.id == snapshot_id
        )
        async with self._transaction("reading a snapshot") as connection:
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else self._snapshot(row)

    async def list_snapshots(self, tenant: str, *, limit: int = 100) -> list[Snapshot]:
        """The tenant's snapshots, newest first."""
        if limit <= 0:
            return []
        query = (
            sa.select(SNAPSHOTS)
            .where(SNAPSHOTS.c.tenant == tenant)
            .order_by(SNAPSHOTS.c.seq.desc())
            .limit(limit)
        )
        async with self._transaction("listing snapshots") as connection:
            rows = (await connection.execute(query)).all()
        return [self._snapshot(row) for row in rows]

    async def delete_snapshot(self, tenant: str, snapshot_id: str) -> bool:
        """Forget the snapshot; False when the tenant has none with this id."""
        delete = SNAPSHOTS.delete().where(
            SNAPSHOTS.c.tenant == tenant, SNAPSHOTS.c.id == snapshot_id
        )
        async with self._transaction("deleting a snapshot") as connection:
            return bool((await connection.execute(delete)).rowcount)

    def _snapshot(self, row: sa.Row[Any]) -> Snapshot:
        try:
            return Snapshot.model_validate_json(row.record)
        except ValueError as exc:
            raise StoreError(
                f"{self._name}: snapshot {row.id!r} of {row.tenant!r} cannot be read: {exc}"
            ) from exc
