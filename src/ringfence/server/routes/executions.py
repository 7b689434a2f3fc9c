"""``/v1/executions``: one-shot executions, each in a fresh sandbox."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from ringfence.models import ExecutionRequest, ExecutionResult, Status
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody, shown

__all__ = ["BUDGET_ERRORS", "router"]

router = APIRouter(prefix="/v1/executions", tags=["executions"])

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such execution in your tenant"},
}
# What starting a sandbox or an execution may also answer: the budgets have no room now.
BUDGET_ERRORS: dict[int | str, dict[str, object]] = {
    429: {
        "model": ErrorBody,
        "description": "Your tenant's budget has no room now (too_many_requests): it runs as "
        "many sandboxes and executions, or holds as much memory or CPU, as it may at once",
    },
    503: {
        "model": ErrorBody,
        "description": "The server has granted all the memory or CPU its host has "
        "(server_at_capacity), or every host uid for sandboxes runs a live one "
        "(sandbox_uids_exhausted); retry when sandboxes or executions end. Or the store or "
        "the backend is unavailable (store_error, backend_unavailable)",
    },
}


@router.post(
    "",
    response_model=ExecutionResult,
    status_code=200,
    responses={
        **_ERRORS,
        **BUDGET_ERRORS,
        202: {"model": ExecutionResult, "description": "Accepted (wait=false)"},
        403: {
            "model": ErrorBody,
            "description": "The request claims an approval or is a remediation: those run "
            "only once approved (forbidden; propose them)",
        },
        409: {"model": ErrorBody, "description": "The id is already used"},
    },
    summary="Run a command once in a fresh sandbox",
)
async def submit(
    body: ExecutionRequest,
    caller: Caller,
    request: Request,
    response: Response,
    wait: Annotated[bool, Query(description="Answer when the execution has ended.")] = True,
) -> ExecutionResult:
    """Runs the command with the request's limits, mounts and environment, in a sandbox
    destroyed at the end. With ``wait=false`` it answers 202 at once: poll
    ``GET /v1/executions/{id}``. The execution goes on if the client disconnects."""
    result = await deps.executions(request).submit(
        caller.tenant, body, wait=wait, actor=caller.key_id
    )
    if not wait:
        response.status_code = 202
    return shown(request, result)


@router.get(
    "",
    response_model=list[ExecutionResult],
    responses=_ERRORS,
    summary="List your executions, newest first",
)
async def list_executions(
    caller: Caller,
    request: Request,
    status: Annotated[Status | None, Query(description="Only executions in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[ExecutionResult]:
    found = await deps.executions(request).list(caller.tenant, status=status, limit=limit)
    return [shown(request, result) for result in found]


@router.get(
    "/{execution_id}",
    response_model=ExecutionResult,
    responses=_ERRORS,
    summary="The state of an execution (live while it runs)",
)
async def get_execution(execution_id: str, caller: Caller, request: Request) -> ExecutionResult:
    return shown(request, await deps.executions(request).get(caller.tenant, execution_id))


@router.post(
    "/{execution_id}/cancel",
    response_model=ExecutionResult,
    responses=_ERRORS,
    summary="Kill the execution's whole process tree",
)
async def cancel_execution(execution_id: str, caller: Caller, request: Request) -> ExecutionResult:
    """Ends ``cancelled``; cancelling a finished execution returns it unchanged."""
    cancelled = await deps.executions(request).cancel(
        caller.tenant, execution_id, actor=caller.key_id
    )
    return shown(request, cancelled)
