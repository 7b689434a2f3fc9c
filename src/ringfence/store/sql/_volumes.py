"""Volumes in SQL: the ``volumes`` table (each record as the API shows it, in JSON; the name
beside it, unique per tenant)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ringfence.errors import StoreError, VolumeExists
from ringfence.models import Volume
from ringfence.store.sql._base import SqlBase
from ringfence.store.sql._schema import NEXT_VOLUME_SEQ, VOLUMES

__all__ = ["SqlVolumes"]


class SqlVolumes(SqlBase):
    """The volume methods of ``SqlStore``."""

    async def add_volume(self, tenant: str, volume: Volume) -> None:
        """Record a new volume.

        Raises:
            VolumeExists: the tenant has a volume of that name.
            StoreError: a volume with its id exists, or the database failed.
        """
        if await self.get_volume(tenant, name=volume.name) is not None:
            raise VolumeExists(f"you have a volume named {volume.name!r} already")
        insert = VOLUMES.insert().values(
            id=volume.id,
            tenant=tenant,
            name=volume.name,
            record=volume.model_dump_json(exclude={"used_bytes"}),
            created_at=datetime.now(UTC),
        )
        if self._engine.dialect.name == "sqlite":
            insert = insert.values(seq=NEXT_VOLUME_SEQ)
        async with self._transaction("adding a volume") as connection:
            try:
                await connection.execute(insert)
            except IntegrityError as exc:  # a create of the same name won the race
                raise VolumeExists(
                    f"you have a volume named {volume.name!r} already (or its id is taken)"
                ) from exc

    async def get_volume(
        self, tenant: str, *, id: str | None = None, name: str | None = None
    ) -> Volume | None:
        """The tenant's volume with this id or name, or None (another tenant's too)."""
        if (id is None) == (name is None):
            raise ValueError("name a volume by its id or by its name")
        column, value = (VOLUMES.c.id, id) if id is not None else (VOLUMES.c.name, name)
        query = sa.select(VOLUMES).where(VOLUMES.c.tenant == tenant, column == value)
        async with self._transaction("reading a volume") as connection:
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else self._volume(row)

    async def list_volumes(self, tenant: str, *, limit: int = 100) -> list[Volume]:
        """The tenant's volumes, newest first."""
        if limit <= 0:
            return []
        query = (
            sa.select(VOLUMES)
            .where(VOLUMES.c.tenant == tenant)
            .order_by(VOLUMES.c.seq.desc())
            .limit(limit)
        )
        async with self._transaction("listing volumes") as connection:
            rows = (await connection.execute(query)).all()
        return [self._volume(row) for row in rows]

    async def delete_volume(self, tenant: str, volume_id: str) -> bool:
        """Forget the volume; False when the tenant has none with this id."""
        delete = VOLUMES.delete().where(VOLUMES.c.tenant == tenant, VOLUMES.c.id == volume_id)
        async with self._transaction("deleting a volume") as connection:
            return bool((await connection.execute(delete)).rowcount)

    def _volume(self, row: sa.Row[Any]) -> Volume:
        try:
            return Volume.model_validate_json(row.record)
        except ValueError as exc:
            raise StoreError(
                f"{self._name}: volume {row.id!r} of {row.tenant!r} cannot be read: {exc}"
            ) from exc
