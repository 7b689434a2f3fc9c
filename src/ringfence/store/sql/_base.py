"""What every part of ``SqlStore`` stands on: its engine, its replica lease, its transactions."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ringfence.errors import StoreError
from ringfence.store._replica import Lease

__all__ = ["SqlBase"]


class SqlBase:
    """An engine and this replica's lease; transactions whose database errors are ``StoreError``."""

    def __init__(self, engine: AsyncEngine) -> None:
        """Wrap ``engine``, whose database must already have the current schema."""
        self._engine = engine
        self._name = engine.url.render_as_string(hide_password=True)
        self._lease = Lease.unlocked()

    @property
    def replica(self) -> int:
        """This store's replica id, stamped on what it runs (see ``_replica``)."""
        return self._lease.replica

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
