"""API keys in SQL: the ``keys`` table."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ringfence.errors import StoreError
from ringfence.models import ApiKey, Role
from ringfence.store.sql._base import SqlBase
from ringfence.store.sql._schema import KEYS

__all__ = ["SqlKeys"]


class SqlKeys(SqlBase):
    """The key methods of ``SqlStore``."""

    async def add_key(self, key: ApiKey) -> None:
        """Store a new key.

        Raises:
            StoreError: a key with its ``key_id`` exists, or the database failed.
        """
        insert = KEYS.insert().values(
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
        query = sa.select(KEYS).where(KEYS.c.key_id == key_id)
        async with self._transaction("reading a key") as connection:
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else self._key(row)

    async def count_keys(self) -> int:
        """How many keys exist, in every tenant.

        Raises:
            StoreError: the database failed.
        """
        query = sa.select(sa.func.count()).select_from(KEYS)
        async with self._transaction("counting keys") as connection:
            count: int = (await connection.execute(query)).scalar_one()
        return count

    async def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        """The keys of ``tenant`` (None: every tenant's), oldest first.

        Raises:
            StoreError: the database failed.
        """
        query = sa.select(KEYS).order_by(KEYS.c.created_at, KEYS.c.key_id)
        if tenant is not None:
            query = query.where(KEYS.c.tenant == tenant)
        async with self._transaction("listing keys") as connection:
            rows = (await connection.execute(query)).all()
        return [self._key(row) for row in rows]

    async def revoke_key(self, key_id: str, at: datetime) -> ApiKey | None:
        """Mark the key revoked (once: the first time stays) and return it.

        Raises:
            StoreError: the database failed.
        """
        update = (
            KEYS.update()
            .where(KEYS.c.key_id == key_id, KEYS.c.revoked_at.is_(None))
            .values(revoked_at=at)
        )
        query = sa.select(KEYS).where(KEYS.c.key_id == key_id)
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
            KEYS.update()
            .where(KEYS.c.key_id == key_id, KEYS.c.revoked_at.is_(None))
            .values(secret_hash=secret_hash, rotated_at=at)
        )
        query = sa.select(KEYS).where(KEYS.c.key_id == key_id)
        async with self._transaction("rotating a key") as connection:
            if (await connection.execute(update)).rowcount != 1:
                return None
            row = (await connection.execute(query)).one()
        return self._key(row)

    def _key(self, row: sa.Row[Any]) -> ApiKey:
        try:
            role = Role(row.role)
        except ValueError as exc:
            raise StoreError(f"{self._name}: key {row.key_id!r} has an unknown role") from exc
        return ApiKey(
            row.key_id, row.tenant, role, row.secret_hash, row.created_at, row.description,
            row.name, row.revoked_at, row.rotated_at,
        )  # fmt: skip
