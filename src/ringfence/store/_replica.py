"""Which control-plane replica runs what, and whether that replica is still alive.

Each ``SqlStore`` is one replica (one ``ringfence serve`` process) with a random id, and
stamps that id on the executions, sandboxes and proposals it runs. What a replica runs lives
in its own process (a local sandbox is known only to the process running it), so when a
replica starts it ends the records of replicas that are gone, and only those.

Liveness, on PostgreSQL: a replica holds a session-level advisory lock keyed by its id on a
connection of its own, for as long as it lives. PostgreSQL releases it when that connection
ends, however the process ended (SIGKILL included), so "alive" is "holds its lock", read
from ``pg_locks`` in the very statement that ends the records: no heartbeat, no clock. On
SQLite (one replica by design) every other id counts as gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["Lease"]

# classid of Ringfence's replica locks ("rf"); objid is the replica id (two-key form, so the
# audit chain's one-key lock can never collide with one of these).
_LOCK_CLASS = 0x7266
_ATTEMPTS = 16
# How often a replica checks that it still holds its lock (a database restart or a dropped
# connection releases it: until it is taken back, a replica starting would sweep this one's
# work as a dead replica's).
KEEP_SECONDS = 5.0

log = logging.getLogger(__name__)

_pg_locks = sa.table(
    "pg_locks",
    sa.column("locktype"),
    sa.column("database"),
    sa.column("classid"),
    sa.column("objid"),
    sa.column("objsubid"),
    sa.column("granted"),
)
_pg_database = sa.table("pg_database", sa.column("oid"), sa.column("datname"))


class Lease:
    """This replica's id, and on PostgreSQL the connection that holds its lock."""

    def __init__(
        self,
        replica: int,
        connection: AsyncConnection | None,
        *,
        keep_seconds: float = KEEP_SECONDS,
    ) -> None:
        """``keep_seconds``: how often the lock's connection is checked (see ``_keep``)."""
        self.replica = replica
        self._connection = connection
        self._keep_seconds = keep_seconds
        self._keeper: asyncio.Task[None] | None = None

    @classmethod
    def unlocked(cls) -> Lease:
        """A replica id without a lock (SQLite: the only replica)."""
        return cls(_new_id(), None)

    @classmethod
    async def take(cls, engine: AsyncEngine, *, keep_seconds: float = KEEP_SECONDS) -> Lease:
        """A fresh replica id; on PostgreSQL, locked for as long as the lease is open, the
        lock's connection checked every ``keep_seconds``.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed.
            RuntimeError: no free id after many tries (never, with 31 random bits).
        """
        if engine.dialect.name != "postgresql":
            return cls.unlocked()
        connection = await engine.connect()
        try:
            for _ in range(_ATTEMPTS):
                replica = _new_id()
                taken = sa.select(sa.func.pg_try_advisory_lock(_LOCK_CLASS, replica))
                if (await connection.execute(taken)).scalar_one():
                    await connection.commit()  # a session lock outlives the transaction
                    lease = cls(replica, connection, keep_seconds=keep_seconds)
                    lease._keeper = asyncio.create_task(lease._keep(engine))
                    return lease
        except BaseException:
            await connection.close()
            raise
        await connection.close()
        raise RuntimeError("no free replica id")

    async def _keep(self, engine: AsyncEngine) -> None:
        """Check the lock's connection every ``keep_seconds``; when it has gone (a database
        restart, a dropped connection), take this replica's id again on a new one."""
        while True:
            await asyncio.sleep(self._keep_seconds)
            if not await self._alive():
                await self._retake(engine)

    async def _alive(self) -> bool:
        if self._connection is None:
            return False
        try:
            await self._connection.execute(sa.select(1))
            await self._connection.commit()
        except SQLAlchemyError:
            return False
        return True

    async def _retake(self, engine: AsyncEngine) -> None:
        """Take this replica's id again on a new connection (the next round tries again if
        the database is still away)."""
        old, self._connection = self._connection, None
        if old is not None:
            log.warning("replica %s lost its lease connection; taking its id again", self.replica)
            with contextlib.suppress(SQLAlchemyError):
                await old.close()
        try:
            connection = await engine.connect()
            taken = sa.select(sa.func.pg_try_advisory_lock(_LOCK_CLASS, self.replica))
            held = (await connection.execute(taken)).scalar_one()
            await connection.commit()
        except SQLAlchemyError as exc:
            log.error("replica %s could not take its id back yet: %s", self.replica, exc)
            return
        if not held:
            log.critical(
                "replica %s cannot take its id back (held elsewhere): a replica starting "
                "may end this one's work as a dead replica's", self.replica,
            )  # fmt: skip
        self._connection = connection

    async def release(self) -> None:
        """End the lease: closing its connection releases the lock."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    def gone(self, owner: sa.ColumnElement[int | None], dialect: str) -> sa.ColumnElement[bool]:
        """Whether the row's owner is gone: NULL, this replica (at its start, whatever it
        finds of its own id is left from before), or no longer holding its lock."""
        if dialect != "postgresql":
            return sa.true()
        mine_or_unknown = sa.or_(owner.is_(None), owner == self.replica)
        this_database = (
            sa.select(_pg_database.c.oid)
            .where(_pg_database.c.datname == sa.func.current_database())
            .scalar_subquery()
        )
        alive = sa.select(sa.cast(_pg_locks.c.objid, sa.BigInteger)).where(
            _pg_locks.c.locktype == "advisory",
            _pg_locks.c.database == this_database,
            _pg_locks.c.classid == _LOCK_CLASS,
            _pg_locks.c.objsubid == 2,
            _pg_locks.c.granted,
            sa.cast(_pg_locks.c.objid, sa.BigInteger) != self.replica,
        )
        return sa.or_(mine_or_unknown, owner.not_in(alive))


def _new_id() -> int:
    return secrets.randbelow(2**31 - 1) + 1
