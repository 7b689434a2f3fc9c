"""One-shot executions for tenants: recorded in the store, run by the executor.

Ids are the tenant's own: two tenants may both use ``deploy-1``. The executor sees a fresh
*run id* for each run (the ``id`` of the *run request* it is handed), so one tenant's
execution ids can neither collide with nor reveal another's. Results come back from the
executor under the run id and leave this service under the execution id.

Tenants are not trusted with the host: over this service a request may not grant host paths
or pick a root filesystem unless the operator allowed it, and its limits must stay within the
operator's ceilings. (The CLI and the Python API, used by the operator, are not held to this.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ringfence.audit.chain import SYSTEM
from ringfence.backends import Executor
from ringfence.config import Config
from ringfence.errors import (
    DuplicateExecution,
    ExecutionNotFound,
    Forbidden,
    InvalidRequest,
    RingfenceError,
)
from ringfence.models import ExecutionRequest, ExecutionResult, Status, is_proposal_id
from ringfence.network.session import Asker, Requester, requesting
from ringfence.policy.limits import check_limits, check_timeout
from ringfence.policy.network import check_tenant_policy, policy_for
from ringfence.policy.placement import Placement, placement
from ringfence.service.audit import AuditLog
from ringfence.service.budget import Budget, Reservation
from ringfence.store import Store

__all__ = ["RESTART_ERROR", "ExecutionService"]

log = logging.getLogger(__name__)

# What only the approval handler may set: an approval, or a remediation's reach.
_APPROVAL_FIELDS = ("checkpoint_id", "approved_by", "remediation_action", "target_namespace")
RESTART_ERROR = "the server stopped while this execution ran; it did not finish"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass
class _Submission:
    """An execution this process accepted and has not finished yet."""

    run_id: str  # the id the executor runs it under (never the tenant's execution id)
    reservation: Reservation  # its share of the budgets, given back once its end is stored
    actor: str = SYSTEM  # who submitted it (egress asks name them)
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Future[ExecutionResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    task: asyncio.Task[None] | None = None


class ExecutionService:
    """Submit, watch and cancel executions on behalf of tenants."""

    def __init__(
        self,
        store: Store,
        executor: Executor,
        config: Config | None = None,
        audit: AuditLog | None = None,
        *,
        budget: Budget,
        egress_asker: Asker | None = None,
    ) -> None:
        """``audit`` None: nothing is recorded (the CLI's own runs). ``budget``: what tenants
        and the server may hold; the server's sandbox service must be given the same one,
        or sandboxes and executions are not counted together (so there is no default).
        ``egress_asker``: who is asked about "ask" egress rules (None: they are denied)."""
        self._store = store
        self._executor = executor
        self._config = config or Config()
        self._audit = audit
        self._budget = budget
        self._live: dict[tuple[str, str], _Submission] = {}
        self._egress_asker = egress_asker

    async def reconcile(self) -> int:
        """After a restart: executions recorded as unfinished can never finish. Returns how
        many were marked failed."""
        failed = await self._store.fail_unfinished(RESTART_ERROR)
        for record in failed:
            log.warning("execution %s/%s was cut off by a restart", record.tenant, record.id)
        return len(failed)

    def check_policy(self, request: ExecutionRequest, *, approved: bool = False) -> None:
        """What a tenant may ask for; checked before anything touches the host.

        Raises:
            Forbidden: the request claims an approval (``checkpoint_id``, ``approved_by``) or
                is a remediation (``remediation_action``, ``target_namespace``), and it does
                not come from the approval handler (``approved``).
            InvalidRequest: host mounts or an image the operator did not allow, or limits
                above the operator's ceilings.
        """
        claimed = [name for name in _APPROVAL_FIELDS if getattr(request, name) is not None]
        if claimed and not approved:
            raise Forbidden(
                f"{', '.join(claimed)}: remediations run only once approved; propose them "
                "(POST /v1/proposals)"
            )
        config = self._config
        if request.mounts and not config.allow_tenant_mounts:
            raise InvalidRequest(
                "mounts: host paths cannot be granted through the API "
                "(the operator can allow it with RINGFENCE_ALLOW_TENANT_MOUNTS=true)"
            )
        if request.image not in (None, config.default_image) and not config.allow_tenant_images:
            raise InvalidRequest(
                f"image: only the default image {config.default_image!r} is available "
                "(the operator can allow others with RINGFENCE_ALLOW_TENANT_IMAGES=true)"
            )
        check_limits(request.limits, config)
        check_timeout(request.timeout, config)
        check_tenant_policy(request.network, config)

    async def submit(
        self,
        tenant: str,
        request: ExecutionRequest,
        *,
        wait: bool,
        actor: str = SYSTEM,
        approved: bool = False,
    ) -> ExecutionResult:
        """Record and start ``request``; with ``wait``, return only once it is terminal.

        The execution goes on if the caller stops waiting.

        Raises:
            DuplicateExecution: the tenant already has an execution with this id.
            InvalidRequest: the request is not allowed, or the backend cannot honour it, or
                its id has the form reserved for proposals' executions (not ``approved``).
            TooManyRequests: the tenant's budget (sandboxes and executions, memory, CPU)
                has no room for it (never for an ``approved`` run: it is not counted there).
            ServerAtCapacity: the server's totals have no room for it.
        """
        if not approved and is_proposal_id(request.id):
            raise InvalidRequest(
                f"id: {request.id!r} has the form of a proposal's id ('cp' and 20 hex "
                "digits), which only a proposal's approved execution runs under; pick another"
            )
        self.check_policy(request, approved=approved)
        network = policy_for(tenant, request.network, self._config)
        run_request = request.model_copy(update={"id": uuid.uuid4().hex, "network": network})
        if request.network is not None:  # header values (credentials) are never stored
            request = request.model_copy(update={"network": request.network.redacted()})
        self._executor.check(run_request)
        key = (tenant, request.id)
        if key in self._live:  # being recorded right now by a concurrent submit
            raise DuplicateExecution(f"an execution with id {request.id!r} already exists")
        limits = request.limits.merged_over(self._config.default_limits)
        # An approved remediation is the humans' decision, not the tenant's: it is not
        # counted in the tenant's budget (its agent could fill it to make the run fail),
        # only in the server's totals, like a warm-pool sandbox.
        holder = None if approved else tenant
        reservation = self._budget.reserve(holder, self._budget.amount(limits))
        submission = _Submission(run_request.id, reservation, actor)
        self._live[key] = submission  # before the first await: a cancel can find it now
        try:
            await self._store.add_execution(tenant, request, _pending(request.id))
        except BaseException:
            del self._live[key]
            self._budget.release(reservation)
            raise
        self._record(tenant, actor, "execution.submit", request.id, details=_described(request))
        submission.task = asyncio.create_task(
            self._run(tenant, request.id, run_request, submission)
        )
        if wait:
            return await asyncio.shield(submission.done)
        return _pending(request.id)

    async def get(self, tenant: str, execution_id: str) -> ExecutionResult:
        """The live state while it runs here, else the stored result.

        Raises:
            ExecutionNotFound: no such execution in this tenant.
        """
        if not _ID.match(execution_id):
            raise ExecutionNotFound(f"no execution with id {execution_id!r}")
        submission = self._live.get((tenant, execution_id))
        if submission is not None:
            try:
                live = await self._executor.get_status(submission.run_id)
                return live.model_copy(update={"execution_id": execution_id})
            except ExecutionNotFound:
                pass  # not started yet, or finished between the two looks: the store has it
        record = await self._store.get_execution(tenant, execution_id)
        if record is None:
            raise ExecutionNotFound(f"no execution with id {execution_id!r}")
        return record.result

    async def list(
        self, tenant: str, *, status: Status | None = None, limit: int = 100
    ) -> list[ExecutionResult]:
        records = await self._store.list_executions(tenant, status=status, limit=limit)
        return [r.result for r in records]

    async def cancel(
        self, tenant: str, execution_id: str, *, actor: str = SYSTEM
    ) -> ExecutionResult:
        """Kill the whole process tree; a finished execution is returned unchanged.

        Raises:
            ExecutionNotFound: no such execution in this tenant.
        """
        submission = self._live.get((tenant, execution_id))
        if submission is None:
            return await self.get(tenant, execution_id)
        self._record(tenant, actor, "execution.cancel", execution_id)
        submission.cancel.set()  # honoured by _run if the executor has not started it yet
        with contextlib.suppress(ExecutionNotFound):
            await self._executor.cancel(submission.run_id)
        return await asyncio.shield(submission.done)

    def placement(self, tenant: str, request: ExecutionRequest) -> Placement:
        """Where ``request`` of ``tenant`` would run here, defaults filled in (for the
        people who approve it)."""
        return placement(request, tenant, self._config, self._executor.name)

    async def aclose(self) -> None:
        """Cancel what runs and wait until every result is stored."""
        submissions = list(self._live.values())
        for submission in submissions:
            submission.cancel.set()
        await self._executor.aclose()
        await asyncio.gather(*(s.done for s in submissions), return_exceptions=True)

    async def _run(
        self, tenant: str, execution_id: str, run_request: ExecutionRequest, submission: _Submission
    ) -> None:
        starts: list[asyncio.Task[None]] = []

        def on_start(running: ExecutionResult) -> None:
            running = running.model_copy(update={"execution_id": execution_id})
            self._record(tenant, SYSTEM, "execution.start", execution_id)
            starts.append(asyncio.create_task(self._store_result(tenant, execution_id, running)))

        # Whatever happens here (an error, a cancel of this task), the reservation is given
        # back once and every waiter gets an answer: all of it under one finally.
        result = ExecutionResult(
            execution_id=execution_id, status=Status.FAILED, error="internal error"
        )
        try:
            result = await self._execute(tenant, execution_id, run_request, submission, on_start)
            result = result.model_copy(update={"execution_id": execution_id})
            self._record(
                tenant,
                SYSTEM,
                "execution.end",
                execution_id,
                outcome=result.status.value,
                details={"exit_code": result.exit_code, "error": result.error},
            )
            # The "running" write goes first: the final result must never be overwritten.
            await asyncio.gather(*starts, return_exceptions=True)
            await self._store_result(tenant, execution_id, result)
        except asyncio.CancelledError:  # the server stops: a restart's reconcile marks it
            result = ExecutionResult(
                execution_id=execution_id, status=Status.CANCELLED,
                error="cancelled: the server stopped it",
            )  # fmt: skip
            raise
        except Exception:  # boundary: recording or storing failed; the run has ended
            log.exception("execution %s/%s could not be recorded", tenant, execution_id)
        finally:
            if self._live.get((tenant, execution_id)) is submission:
                del self._live[tenant, execution_id]
            self._budget.release(submission.reservation)
            if not submission.done.done():
                submission.done.set_result(result)

    async def _execute(
        self,
        tenant: str,
        execution_id: str,
        run_request: ExecutionRequest,
        submission: _Submission,
        on_start: Callable[[ExecutionResult], None],
    ) -> ExecutionResult:
        """Run it; an error inside Ringfence is a failed result, not an exception."""
        try:
            if submission.cancel.is_set():
                return ExecutionResult(
                    execution_id=run_request.id, status=Status.CANCELLED,
                    error="cancelled before it started",
                )  # fmt: skip
            # execute() registers the run before its first await, so from here on a
            # cancel reaches the executor.
            subject = f"execution:{execution_id}"
            requester = Requester(
                tenant, subject, submission.actor, self._audit, self._egress_asker
            )
            with requesting(requester):
                return await self._executor.execute(run_request, on_start=on_start)
        except Exception as exc:  # boundary: whatever happens, the execution must end
            log.exception("execution %s/%s failed inside Ringfence", tenant, execution_id)
            message = exc.message if isinstance(exc, RingfenceError) else "internal error"
            return ExecutionResult(execution_id=run_request.id, status=Status.FAILED, error=message)

    async def _store_result(self, tenant: str, execution_id: str, result: ExecutionResult) -> None:
        for attempt in range(3):
            try:
                await self._store.update_execution(tenant, execution_id, result)
                return
            except RingfenceError:
                log.exception("could not store the result of %s/%s", tenant, execution_id)
                await asyncio.sleep(0.5 * (attempt + 1))

    def _record(
        self,
        tenant: str,
        actor: str,
        action: str,
        execution_id: str,
        outcome: str = "ok",
        details: dict[str, object] | None = None,
    ) -> None:
        if self._audit is not None:
            self._audit.record(
                tenant, actor, action, f"execution:{execution_id}", outcome, details or {}
            )


def _described(request: ExecutionRequest) -> dict[str, object]:
    """What the audit keeps of a request: everything but the environment's values."""
    described = request.model_dump(mode="json", exclude_none=True)
    described["env"] = sorted(request.env)  # names only: values may be secrets
    return described


def _pending(execution_id: str) -> ExecutionResult:
    return ExecutionResult(execution_id=execution_id, status=Status.PENDING)
