"""Executions in SQL: the ``executions`` table (request and result as JSON, the status beside)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ringfence.errors import DuplicateExecution, ExecutionNotFound, StoreError
from ringfence.models import ExecutionRecord, ExecutionRequest, ExecutionResult, Status
from ringfence.store.sql._base import SqlBase
from ringfence.store.sql._schema import EXECUTIONS, NEXT_EXECUTION_SEQ

__all__ = ["SqlExecutions"]

_UNFINISHED = [status.value for status in Status if not status.is_terminal]


class SqlExecutions(SqlBase):
    """The execution methods of ``SqlStore``."""

    async def add_execution(
        self, tenant: str, request: ExecutionRequest, result: ExecutionResult
    ) -> ExecutionRecord:
        """Record a new execution under ``(tenant, request.id)``.

        Raises:
            DuplicateExecution: the tenant already has an execution with this id.
            StoreError: the database failed.
        """
        now = datetime.now(UTC)
        insert = EXECUTIONS.insert().values(
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
            insert = insert.values(seq=NEXT_EXECUTION_SEQ)
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
        query = sa.select(EXECUTIONS).where(
            EXECUTIONS.c.tenant == tenant, EXECUTIONS.c.id == execution_id
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
        query = sa.select(EXECUTIONS).where(EXECUTIONS.c.tenant == tenant)
        if status is not None:
            query = query.where(EXECUTIONS.c.status == status.value)
        query = query.order_by(EXECUTIONS.c.seq.desc()).limit(max(limit, 0))
        async with self._transaction("listing executions") as connection:
            rows = (await connection.execute(query)).all()
        return [self._record(row) for row in rows]

    async def fail_unfinished(self, error: str) -> list[ExecutionRecord]:
        """Mark every execution that is not terminal as ``failed`` with ``error``; return them.

        Raises:
            StoreError: the database failed, or a stored execution cannot be read.
        """
        query = (
            sa.select(EXECUTIONS)
            .where(EXECUTIONS.c.status.in_(_UNFINISHED), self._gone(EXECUTIONS.c.owner))
            .order_by(EXECUTIONS.c.seq)
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

    def _record(self, row: sa.Row[Any]) -> ExecutionRecord:
        try:
            request = ExecutionRequest.model_validate_json(row.request)
            result = ExecutionResult.model_validate_json(row.result)
        except ValueError as exc:  # pydantic's ValidationError is one
            raise StoreError(
                f"{self._name}: execution {row.id!r} of {row.tenant!r} cannot be read: {exc}"
            ) from exc
        return ExecutionRecord(row.tenant, row.id, request, result, row.created_at, row.updated_at)


def _set_result(
    tenant: str, execution_id: str, result: ExecutionResult, now: datetime
) -> sa.Update:
    return (
        EXECUTIONS.update()
        .where(EXECUTIONS.c.tenant == tenant, EXECUTIONS.c.id == execution_id)
        .values(status=result.status.value, result=result.model_dump_json(), updated_at=now)
    )
