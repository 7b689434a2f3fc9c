"""Interactive sandboxes in SQL: the ``sandboxes`` table (each as the API shows it, in JSON)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ringfence.errors import SandboxNotFound, StoreError
from ringfence.models import Sandbox, SandboxState
from ringfence.store.sql._base import SqlBase
from ringfence.store.sql._schema import NEXT_SANDBOX_SEQ, SANDBOXES

__all__ = ["SqlSandboxes"]


class SqlSandboxes(SqlBase):
    """The sandbox methods of ``SqlStore``."""

    async def add_sandbox(self, tenant: str, sandbox: Sandbox) -> None:
        """Record a new sandbox.

        Raises:
            StoreError: a sandbox with its id exists, or the database failed.
        """
        now = datetime.now(UTC)
        insert = SANDBOXES.insert().values(
            id=sandbox.id,
            tenant=tenant,
            state=sandbox.state.value,
            record=sandbox.model_dump_json(),
            created_at=now,
            updated_at=now,
            owner=self.replica,
        )
        if self._engine.dialect.name == "sqlite":
            insert = insert.values(seq=NEXT_SANDBOX_SEQ)
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
            update = _set_sandbox(tenant, sandbox, datetime.now(UTC))
            if sandbox.state is SandboxState.RUNNING:  # resumed here: this replica runs it
                update = update.values(owner=self.replica)
            updated = await connection.execute(update)
            if updated.rowcount == 0:
                raise SandboxNotFound(f"no sandbox with id {sandbox.id!r}")

    async def get_sandbox(self, tenant: str, sandbox_id: str) -> Sandbox | None:
        """The sandbox, or None (also when it belongs to another tenant).

        Raises:
            StoreError: the database failed, or the stored sandbox cannot be read.
        """
        query = sa.select(SANDBOXES).where(
            SANDBOXES.c.tenant == tenant, SANDBOXES.c.id == sandbox_id
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
        query = sa.select(SANDBOXES).where(SANDBOXES.c.tenant == tenant)
        if states is not None:
            query = query.where(SANDBOXES.c.state.in_([state.value for state in states]))
        query = query.order_by(SANDBOXES.c.seq.desc())
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

    async def end_running_sandboxes(
        self, error: str, frozen_error: str | None = None
    ) -> list[tuple[str, Sandbox]]:
        """Mark every running sandbox of a gone replica ``failed`` with ``error``, and every
        paused one of it that held its memory with ``frozen_error`` (when given); return
        them, updated.

        Raises:
            StoreError: the database failed, or a stored sandbox cannot be read.
        """
        states = [SandboxState.RUNNING.value]
        if frozen_error is not None:
            states.append(SandboxState.PAUSED.value)
        query = (
            sa.select(SANDBOXES)
            .where(SANDBOXES.c.state.in_(states), self._gone(SANDBOXES.c.owner))
            .order_by(SANDBOXES.c.seq)
            .with_for_update()
        )
        ended = []
        async with self._transaction("ending running sandboxes") as connection:
            now = datetime.now(UTC)
            for row in (await connection.execute(query)).all():
                found = self._sandbox(row)
                if found.state is SandboxState.PAUSED and not found.memory:
                    continue  # kept on disk: it survives the restart
                why = error if found.state is SandboxState.RUNNING else frozen_error
                sandbox = found.ended(SandboxState.FAILED, why)
                await connection.execute(_set_sandbox(row.tenant, sandbox, now))
                ended.append((row.tenant, sandbox))
        return ended

    def _sandbox(self, row: sa.Row[Any]) -> Sandbox:
        try:
            return Sandbox.model_validate_json(row.record)
        except ValueError as exc:
            raise StoreError(
                f"{self._name}: sandbox {row.id!r} of {row.tenant!r} cannot be read: {exc}"
            ) from exc


def _set_sandbox(tenant: str, sandbox: Sandbox, now: datetime) -> sa.Update:
    return (
        SANDBOXES.update()
        .where(SANDBOXES.c.tenant == tenant, SANDBOXES.c.id == sandbox.id)
        .values(state=sandbox.state.value, record=sandbox.model_dump_json(), updated_at=now)
    )
