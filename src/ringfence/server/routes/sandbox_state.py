"""Sandbox state on the native API: pause and resume, checkpoints and rollback, fork, and
snapshots (``/v1/sandboxes/{id}/...`` and ``/v1/snapshots``). The semantics are the
service's (``service.sandbox_pausing``, ``service.sandbox_state``): these routes find the
caller by its key and answer in the native shapes. docs/state.md tells what is captured."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from ringfence.models import (
    CHECKPOINT_ID,
    MAX_FORK_CHILDREN,
    SNAPSHOT_ID,
    CheckpointInfo,
    Forked,
    Paused,
    Sandbox,
    Snapshot,
)
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody, shown
from ringfence.server.routes.executions import BUDGET_ERRORS
from ringfence.service.sandboxes import SandboxService

__all__ = ["router", "snapshots"]

router = APIRouter(prefix="/v1/sandboxes", tags=["sandbox state"])
snapshots = APIRouter(prefix="/v1/snapshots", tags=["sandbox state"])

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such sandbox in your tenant"},
    409: {
        "model": ErrorBody,
        "description": "The sandbox has ended, or is paused and was created with auto_resume "
        "off (sandbox_not_running); or its backend cannot capture its state, the message "
        "says why (state_unsupported)",
    },
    421: {
        "model": ErrorBody,
        "description": "Another server replica runs the sandbox (sandbox_on_another_replica)",
    },
}
_CHECKPOINT_ERRORS: dict[int | str, dict[str, object]] = {
    **_ERRORS,
    404: {
        "model": ErrorBody,
        "description": "No such sandbox in your tenant, or no such checkpoint of it (not_found)",
    },
}
_BUDGET: dict[int | str, dict[str, object]] = {
    507: {
        "model": ErrorBody,
        "description": "The sandbox's checkpoints, or your tenant's snapshots, are at their "
        "budget (snapshot_budget_exceeded): delete one first",
    },
}
_SNAPSHOT_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such snapshot in your tenant"},
}

SandboxId = Annotated[str, Path(max_length=64, description="The sandbox's id.")]
CheckpointId = Annotated[str, Path(pattern=CHECKPOINT_ID, description="The checkpoint's id.")]
SnapshotId = Annotated[str, Path(pattern=SNAPSHOT_ID, description="The snapshot's id.")]


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    memory: bool = Field(
        False,
        description="True: freeze it, keeping its memory (its processes go on where they "
        "were; needs a freezer). False: save its files to disk and free everything (its "
        "processes start again on resume).",
    )


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(pattern=CHECKPOINT_ID, description="A checkpoint of this sandbox.")


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int = Field(
        1, ge=1, le=MAX_FORK_CHILDREN, description="How many children to start from it."
    )


def _service(request: Request) -> SandboxService:
    return deps.sandboxes(request)


@router.post(
    "/{sandbox_id}/pause",
    response_model=Paused,
    responses=_ERRORS,
    summary="Pause the sandbox (memory kept, or files only); any request resumes it",
)
async def pause(
    sandbox_id: SandboxId, caller: Caller, request: Request, body: PauseRequest | None = None
) -> Paused:
    """Its timeout clock stops while paused, and it no longer counts as running. A sandbox
    paused to disk (memory false) survives a server restart; a frozen one (memory true)
    is saved to disk at a clean shutdown, and lost in a crash."""
    memory = body.memory if body is not None else False
    paused = await _service(request).pause(
        caller.tenant, sandbox_id, memory=memory, actor=caller.key_id
    )
    return paused.model_copy(update={"sandbox": shown(request, paused.sandbox)})


@router.post(
    "/{sandbox_id}/resume",
    response_model=Sandbox,
    responses={**_ERRORS, **BUDGET_ERRORS},
    summary="Resume a paused sandbox under the same id (a running one is returned as is)",
)
async def resume(sandbox_id: SandboxId, caller: Caller, request: Request) -> Sandbox:
    service = _service(request)
    return shown(request, await service.resume(caller.tenant, sandbox_id, actor=caller.key_id))


@router.post(
    "/{sandbox_id}/checkpoints",
    response_model=CheckpointInfo,
    status_code=201,
    responses={**_ERRORS, **_BUDGET},
    summary="Checkpoint the sandbox's files (its processes keep running)",
)
async def checkpoint(sandbox_id: SandboxId, caller: Caller, request: Request) -> CheckpointInfo:
    state = _service(request).state
    return await state.checkpoint(caller.tenant, sandbox_id, actor=caller.key_id)


@router.get(
    "/{sandbox_id}/checkpoints",
    response_model=list[CheckpointInfo],
    responses=_ERRORS,
    summary="The sandbox's checkpoints, oldest first",
)
async def checkpoints(
    sandbox_id: SandboxId, caller: Caller, request: Request
) -> list[CheckpointInfo]:
    return await _service(request).state.checkpoints(caller.tenant, sandbox_id)


@router.post(
    "/{sandbox_id}/rollback",
    status_code=204,
    responses=_CHECKPOINT_ERRORS,
    summary="Restore the sandbox's files to a checkpoint, in place (processes survive)",
)
async def rollback(
    sandbox_id: SandboxId, body: RollbackRequest, caller: Caller, request: Request
) -> Response:
    state = _service(request).state
    await state.rollback(caller.tenant, sandbox_id, body.checkpoint, actor=caller.key_id)
    return Response(status_code=204)


@router.delete(
    "/{sandbox_id}/checkpoints/{checkpoint_id}",
    status_code=204,
    responses=_CHECKPOINT_ERRORS,
    summary="Delete a checkpoint (its bytes go back to the sandbox's budget)",
)
async def delete_checkpoint(
    sandbox_id: SandboxId, checkpoint_id: CheckpointId, caller: Caller, request: Request
) -> Response:
    state = _service(request).state
    await state.delete_checkpoint(caller.tenant, sandbox_id, checkpoint_id, actor=caller.key_id)
    return Response(status_code=204)


@router.post(
    "/{sandbox_id}/fork",
    response_model=Forked,
    status_code=201,
    responses={
        **_ERRORS,
        **BUDGET_ERRORS,
        **_BUDGET,
        500: {"model": ErrorBody, "description": "A child failed to start (none was kept)"},
    },
    summary="Start children from one checkpoint of the sandbox's files",
)
async def fork(
    sandbox_id: SandboxId, caller: Caller, request: Request, body: ForkRequest | None = None
) -> Forked:
    """Each child is a new sandbox (its own id and tokens) with the parent's template,
    limits, metadata, environment and egress policy; its processes start fresh (every PRNG
    seeded anew). Refused as a whole when the budgets have no room for every child."""
    count = body.count if body is not None else 1
    forked = await _service(request).state.fork(
        caller.tenant, sandbox_id, count, actor=caller.key_id
    )
    children = [shown(request, child) for child in forked.children]
    return forked.model_copy(update={"children": children})


@router.post(
    "/{sandbox_id}/snapshot",
    response_model=Snapshot,
    status_code=201,
    responses={**_ERRORS, **_BUDGET},
    summary="Persist the sandbox's files as a snapshot new sandboxes start from",
)
async def snapshot(sandbox_id: SandboxId, caller: Caller, request: Request) -> Snapshot:
    state = _service(request).state
    return await state.snapshot(caller.tenant, sandbox_id, actor=caller.key_id)


@snapshots.get(
    "", response_model=list[Snapshot], responses=_SNAPSHOT_ERRORS, summary="Your snapshots"
)
async def list_snapshots(
    caller: Caller, request: Request, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[Snapshot]:
    return await _service(request).state.snapshots(caller.tenant, limit=limit)


@snapshots.get(
    "/{snapshot_id}", response_model=Snapshot, responses=_SNAPSHOT_ERRORS, summary="A snapshot"
)
async def get_snapshot(snapshot_id: SnapshotId, caller: Caller, request: Request) -> Snapshot:
    return await _service(request).state.get_snapshot(caller.tenant, snapshot_id)


@snapshots.delete(
    "/{snapshot_id}",
    status_code=204,
    responses=_SNAPSHOT_ERRORS,
    summary="Delete a snapshot (sandboxes started from it keep their files)",
)
async def delete_snapshot(snapshot_id: SnapshotId, caller: Caller, request: Request) -> Response:
    state = _service(request).state
    await state.delete_snapshot(caller.tenant, snapshot_id, actor=caller.key_id)
    return Response(status_code=204)
