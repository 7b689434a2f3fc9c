"""``SqlStore``: the store in SQLite (the default: one file) or PostgreSQL (several replicas).

SQLAlchemy Core over async drivers (aiosqlite, psycopg 3). The schema belongs to the Alembic
migrations in ``migrations/``; ``SqlStore.open`` applies them before it returns. Requests and
results are kept as the JSON of their models, with the status copied beside them for filtering.
"""

from __future__ import annotations

import asyncio

from alembic.util import CommandError
from sqlalchemy.engine import URL

from ringfence.errors import StoreError
from ringfence.store._replica import KEEP_SECONDS, Lease
from ringfence.store.sql._audit import SqlAudit
from ringfence.store.sql._engine import create_engine, migrate, parse_url, sqlite_url
from ringfence.store.sql._executions import SqlExecutions
from ringfence.store.sql._keys import SqlKeys
from ringfence.store.sql._proposals import SqlProposals
from ringfence.store.sql._sandboxes import SqlSandboxes
from ringfence.store.sql._schema import METADATA
from ringfence.store.sql._snapshots import SqlSnapshots
from ringfence.store.sql._volumes import SqlVolumes

__all__ = ["METADATA", "SqlStore", "sqlite_url"]


class SqlStore(
    SqlKeys, SqlExecutions, SqlSandboxes, SqlSnapshots, SqlVolumes, SqlAudit, SqlProposals
):
    """The ``Store`` in a SQL database. Get one with ``await SqlStore.open(url)``.

    Safe to use from several tasks of one event loop, and from several processes or
    control-plane replicas on one database. ``aclose`` closes its connections.
    """

    @classmethod
    async def open(cls, url: str | URL, *, lease_check_seconds: float = KEEP_SECONDS) -> SqlStore:
        """Connect to the database at ``url``, bring its schema up to date, return the store.

        ``url`` is a SQLAlchemy URL, ``sqlite:///PATH`` (see ``sqlite_url``) or
        ``postgresql://USER:PASSWORD@HOST/DATABASE``; without a driver in it, the async one
        is chosen (aiosqlite, psycopg). A SQLite file and its directory are created when
        missing, readable by this user only. On PostgreSQL the replica's lock is checked
        every ``lease_check_seconds`` (and taken back when a restart released it).

        Raises:
            StoreError: the URL names no supported database, its driver is not installed,
                the database cannot be reached or created, or a newer Ringfence migrated it.
        """
        engine = create_engine(parse_url(url))
        store = cls(engine)
        try:
            await store._migrate()
            with store._translated("taking a replica id"):
                store._lease = await Lease.take(engine, keep_seconds=lease_check_seconds)
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
                await asyncio.to_thread(migrate, self._engine.url)
        except CommandError as exc:
            raise StoreError(
                f"{self._name}: its schema is at a revision this Ringfence does not know "
                f"(a newer version migrated it?): {exc}"
            ) from exc

    async def aclose(self) -> None:
        """Close every connection (and so end this replica's lease)."""
        try:
            with self._translated("ending the replica's lease"):
                await self._lease.release()
        finally:
            await self._engine.dispose()
