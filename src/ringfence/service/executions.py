"""One-shot executions for tenants: recorded in the store, run by the executor.

Ids are the tenant's own: two tenants may both use ``deploy-1``. The executor sees a fresh
internal id for each run, so one tenant's ids can neither collide with nor reveal another's.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from ringfence.backends import Executor
from ringfence.errors import ExecutionNotFound, RingfenceError
from ringfence.models import ExecutionRequest, ExecutionResult, Status
from ringfence.store import Store

__all__ = ["RESTART_ERROR", "ExecutionService"]

log = logging.getLogger(__name__)

RESTART_ERROR = "the server stopped while this execution ran; it did not finish"


class ExecutionService:
    """Submit, watch and cancel executions on behalf of tenants."""

    def __init__(self, store: Store, executor: Executor) -> None:
        self._store = store
        self._executor = executor
        self._running: dict[tuple[str, str], tuple[str, asyncio.Task[ExecutionResult]]] = {}

    async def reconcile(self) -> int:
        """After a restart: executions recorded as unfinished can never finish. Returns how
        many were marked failed."""
        failed = await self._store.fail_unfinished(RESTART_ERROR)
        for record in failed:
            log.warning("execution %s/%s was cut off by a restart", record.tenant, record.id)
        return len(failed)

    async def submit(
        self, tenant: str, request: ExecutionRequest, *, wait: bool
    ) -> ExecutionResult:
        """Record and start ``request``; with ``wait``, return only once it is terminal.

        The execution goes on if the caller stops waiting.

        Raises:
            DuplicateExecution: the tenant already has an execution with this id.
            InvalidRequest: the backend cannot honour the request.
        """
        internal = request.model_copy(update={"id": uuid.uuid4().hex})
        self._executor.check(internal)
        pending = ExecutionResult(execution_id=request.id, status=Status.PENDING)
        await self._store.add_execution(tenant, request, pending)
        task = asyncio.create_task(self._run(tenant, request.id, internal))
        self._running[tenant, request.id] = (internal.id, task)
        if wait:
            return await asyncio.shield(task)
        return pending

    async def get(self, tenant: str, execution_id: str) -> ExecutionResult:
        """The live state while it runs here, else the stored result.

        Raises:
            ExecutionNotFound: no such execution in this tenant.
        """
        running = self._running.get((tenant, execution_id))
        if running is not None:
            try:
                live = await self._executor.get_status(running[0])
                return live.model_copy(update={"execution_id": execution_id})
            except ExecutionNotFound:
                pass  # finished between the two looks: the store has it
        record = await self._store.get_execution(tenant, execution_id)
        if record is None:
            raise ExecutionNotFound(f"no execution with id {execution_id!r}")
        return record.result

    async def list(
        self, tenant: str, *, status: Status | None = None, limit: int = 100
    ) -> list[ExecutionResult]:
        records = await self._store.list_executions(tenant, status=status, limit=limit)
        return [r.result for r in records]

    async def cancel(self, tenant: str, execution_id: str) -> ExecutionResult:
        """Kill the whole process tree; a finished execution is returned unchanged.

        Raises:
            ExecutionNotFound: no such execution in this tenant.
        """
        running = self._running.get((tenant, execution_id))
        if running is not None:
            internal_id, task = running
            await self._executor.cancel(internal_id)
            return await asyncio.shield(task)
        return await self.get(tenant, execution_id)

    async def aclose(self) -> None:
        """Cancel what runs and wait until every result is stored."""
        tasks = [task for _, task in self._running.values()]
        await self._executor.aclose()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(
        self, tenant: str, execution_id: str, internal: ExecutionRequest
    ) -> ExecutionResult:
        try:
            try:
                result = await self._executor.execute(internal)
            except RingfenceError as exc:  # checked at submit; still, never leave it pending
                result = ExecutionResult(
                    execution_id=internal.id, status=Status.FAILED, error=exc.message
                )
            result = result.model_copy(update={"execution_id": execution_id})
            try:
                await self._store.update_execution(tenant, execution_id, result)
            except RingfenceError:
                log.exception("could not store the result of %s/%s", tenant, execution_id)
            return result
        finally:
            del self._running[tenant, execution_id]
