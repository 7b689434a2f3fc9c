"""E2B's doors to sandbox state: pause, connect's resume, the lifecycle of a create
(``on_timeout``, ``auto_resume``), snapshots and fork, onto the native service
(``service.sandbox_pausing``, ``service.sandbox_state``; docs/e2b.md's table).

How E2B's words map:

- ``pause()`` (memory true, E2B's default) freezes the sandbox: its processes and memory
  are kept where they are. ``mode="filesystem"`` (memory false) saves its files to disk and
  frees everything; its processes start again on resume. A paused sandbox is 409 to a
  second pause (the SDK's ``False``), whatever kind it is.
- ``connect()`` resumes a paused sandbox (explicitly, whatever its ``auto_resume``);
  ``on_resume="reboot"`` (memory false) drops a frozen one's memory first (it is saved to
  disk and started again on its files).
- A create's ``autoPause`` is ``on_timeout="pause"``: at its timeout the sandbox is paused
  to disk (files kept, processes restart on resume), which is what ``autoPauseMemory``
  false asks for; true (memory kept at a timeout) is refused, never downgraded. A
  sandbox made here resumes on a request only with ``autoResume`` enabled (E2B's default
  is off), and, as E2B says, only with ``autoPause``; not with ``autoPauseMemory`` false.
- Snapshots are the tenant's native snapshots: files only (``mode="full"`` is refused),
  unnamed (a ``name`` is refused), their id (``sn…``) a template id to create from.
  ``delete_snapshot`` is E2B's template delete.
- ``fork(count)`` is the native fork: its children start from one checkpoint of the
  parent's files (their processes start fresh), live ``timeout`` seconds (E2B's default
  15), and all start or none (each entry then carries why, as E2B's per-fork errors do).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ringfence.errors import (
    HTTP_STATUS,
    CheckpointNotFound,
    Conflict,
    InvalidRequest,
    RingfenceError,
    SandboxNotFound,
    SandboxNotRunning,
    StateUnsupported,
)
from ringfence.models import (
    MAX_FORK_CHILDREN,
    MAX_TIMEOUT_SECONDS,
    Sandbox,
    SandboxState,
    Snapshot,
)
from ringfence.server.e2b.context import E2bContext, answer, caller, gone
from ringfence.server.e2b.errors import error_response
from ringfence.server.e2b.models import Lifecycle, NewSandbox
from ringfence.service.keys import Principal
from ringfence.templates import TemplateNotFound

__all__ = ["awaken", "lifecycle", "lifecycle_of", "resumed_timeout", "router", "snapshot_named"]

router = APIRouter()
T = TypeVar("T")

SandboxId = Annotated[str, Path(max_length=64)]
ApiKey = Annotated[str | None, Header(alias="X-API-KEY")]

# E2B's snapshot ids carry a tag ("abc123:default"); a native snapshot id, with or without.
_SNAPSHOT = re.compile(r"(sn[0-9a-f]{20})(:default)?")
_FORK_TIMEOUT = 15  # E2B's default time to live of a fork's children, in seconds
_RESUME_TIMEOUT = 300.0  # E2B's connect default: a resumed sandbox lives this long from now
_HEALTH_SECONDS = 5.0  # how long a strict pause waits for the daemon to answer
_SNAPSHOT_CEILING = 1000  # snapshots of one tenant considered by one list request


class PauseRequest(BaseModel):
    """``POST /sandboxes/{id}/pause``."""

    model_config = ConfigDict(extra="ignore")

    memory: bool = True
    requireHealthyGuest: bool = False


class SnapshotRequest(BaseModel):
    """``POST /sandboxes/{id}/snapshots``."""

    model_config = ConfigDict(extra="ignore")

    name: str | None = Field(None, max_length=256)
    memory: bool | None = None


class ForkRequest(BaseModel):
    """``POST /sandboxes/{id}/fork``."""

    model_config = ConfigDict(extra="ignore")

    timeout: int = Field(_FORK_TIMEOUT, gt=0, le=int(MAX_TIMEOUT_SECONDS))
    count: int = Field(1, ge=1)


def snapshot_named(template_id: str) -> str | None:
    """The native snapshot id an E2B template id names, if it names one."""
    found = _SNAPSHOT.fullmatch(template_id)
    return found.group(1) if found else None


def lifecycle_of(body: NewSandbox) -> dict[str, Any]:
    """The ``SandboxSpec`` fields of a create's lifecycle (see the module docstring).

    Raises:
        InvalidRequest: a combination E2B refuses, or a timeout pause keeping memory.
    """
    auto_resume = body.autoResume.enabled if body.autoResume is not None else False
    if auto_resume and not body.autoPause:
        raise InvalidRequest(
            "autoResume: can be enabled only with autoPause (on_timeout 'pause'), as E2B's API says"
        )
    if body.autoPause and body.autoPauseMemory:
        raise InvalidRequest(
            "autoPauseMemory: a timeout pause keeping memory is not supported; at its "
            "timeout a sandbox is paused to disk here (files kept, processes restarted on "
            "resume): leave mode unset or use mode 'filesystem'"
        )
    if auto_resume and body.autoPauseMemory is False:
        raise InvalidRequest(
            "autoResume: a filesystem-only timeout pause (autoPauseMemory false) cannot be "
            "auto-resumed, as E2B's API says: resume it with connect"
        )
    on_timeout = "pause" if body.autoPause else "kill"
    return {"on_timeout": on_timeout, "auto_resume": auto_resume}


def resumed_timeout(context: E2bContext) -> float:
    """How long a sandbox resumed by a connect without a timeout lives from now: E2B's
    default (5 minutes), under the operator's ceiling."""
    return min(_RESUME_TIMEOUT, context.sandboxes.config.max_timeout)


def lifecycle(sandbox: Sandbox) -> Lifecycle:
    return Lifecycle(autoResume=sandbox.auto_resume, onTimeout=sandbox.on_timeout)


async def awaken(
    context: E2bContext,
    principal: Principal,
    sandbox_id: str,
    *,
    memory: bool | None,
    auto_pause: bool | None = None,
) -> tuple[Sandbox, bool]:
    """The sandbox, running: a paused one is resumed (``connect``), whatever its
    auto_resume. ``memory`` False: a frozen one's memory is dropped first (saved to disk,
    started again on its files). ``auto_pause`` (v1's resume): its on_timeout, which
    cannot change after its create. Returns it and whether it was resumed.

    Raises:
        SandboxNotFound: no such sandbox, or it has ended.
        InvalidRequest: ``auto_pause`` asks for another on_timeout than its own.
        What ``SandboxService.resume`` raises.
    """
    service, tenant, actor = context.sandboxes, principal.tenant, principal.key_id
    sandbox = await service.get(tenant, sandbox_id)
    if sandbox.state.is_terminal:
        raise gone(sandbox_id)
    if auto_pause is not None and auto_pause != (sandbox.on_timeout == "pause"):
        raise InvalidRequest(
            f"autoPause: sandbox {sandbox_id}'s on_timeout is {sandbox.on_timeout!r}, set at "
            "its create; a resume does not change it"
        )
    if sandbox.state is SandboxState.RUNNING:
        return sandbox, False
    try:
        if memory is False and sandbox.memory:
            reboot = service.pause(tenant, sandbox_id, actor=actor, reason="reboot")
            await _unsupported_as_invalid(reboot)
        resumed = await service.resume(tenant, sandbox_id, actor=actor)
    except SandboxNotRunning:
        raise gone(sandbox_id) from None
    if resumed.state is not SandboxState.RUNNING:
        raise gone(sandbox_id)
    return resumed, True


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause(
    sandbox_id: SandboxId,
    request: Request,
    body: PauseRequest | None = None,
    x_api_key: ApiKey = None,
) -> Response:
    """204 once paused; 409 if it was paused already (the SDK's ``False``); 404 for an
    ended or unknown one. ``requireHealthyGuest``: 503 (it keeps running) unless its
    daemon answers."""
    context, principal = await caller(request, x_api_key)
    body = body or PauseRequest()
    sandbox = await context.sandboxes.get(principal.tenant, sandbox_id)
    if sandbox.state is SandboxState.PAUSED:
        raise Conflict(f"sandbox {sandbox_id} is already paused")
    if sandbox.state is not SandboxState.RUNNING:
        raise gone(sandbox_id)
    if body.requireHealthyGuest:
        unhealthy = await _unhealthy(context, principal, sandbox_id)
        if unhealthy is not None:
            return unhealthy
    try:
        await _unsupported_as_invalid(
            context.sandboxes.pause(
                principal.tenant, sandbox_id, memory=body.memory, actor=principal.key_id
            )
        )
    except SandboxNotRunning:
        raise gone(sandbox_id) from None
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
async def create_snapshot(
    sandbox_id: SandboxId,
    request: Request,
    body: SnapshotRequest | None = None,
    x_api_key: ApiKey = None,
) -> JSONResponse:
    """A snapshot of its files; the sandbox keeps running."""
    context, principal = await caller(request, x_api_key)
    body = body or SnapshotRequest()
    if body.memory:
        raise InvalidRequest(
            "memory: snapshots keep the files only here (sandboxes made from one start "
            "their processes fresh): use mode 'filesystem' or leave it unset"
        )
    if body.name:
        raise InvalidRequest(
            "name: snapshots are not named here; use the snapshotID it answers (a template "
            "id for Sandbox.create)"
        )
    await _present(context, principal, sandbox_id)
    try:
        snapshot = await _unsupported_as_invalid(
            context.sandboxes.state.snapshot(principal.tenant, sandbox_id, actor=principal.key_id)
        )
    except SandboxNotRunning:
        raise await _not_running(context, principal, sandbox_id) from None
    return JSONResponse(_snapshot_info(snapshot), status_code=201)


@router.get("/snapshots")
async def list_snapshots(request: Request, x_api_key: ApiKey = None) -> JSONResponse:
    """The tenant's snapshots, newest first, filtered by ``sandboxID`` and ``name`` (an
    id, tagged or not), a page of ``limit`` at a time (``x-next-token``)."""
    context, principal = await caller(request, x_api_key)
    query = request.query_params
    found = await context.sandboxes.state.snapshots(principal.tenant, limit=_SNAPSHOT_CEILING)
    if query.get("sandboxID"):
        found = [s for s in found if s.sandbox_id == query["sandboxID"]]
    if query.get("name"):
        wanted = snapshot_named(query["name"])
        found = [s for s in found if s.id == wanted]
    start = _number(query.get("nextToken"), "nextToken", default=0, ceiling=None)
    limit = _number(query.get("limit"), "limit", default=100, ceiling=1000)
    page = found[start : start + limit]
    response = JSONResponse([_snapshot_info(s) for s in page])
    if start + limit < len(found):
        response.headers["x-next-token"] = str(start + limit)
    return response


@router.delete("/templates/{template_id}", status_code=204)
async def delete_snapshot(
    template_id: Annotated[str, Path(max_length=128)], request: Request, x_api_key: ApiKey = None
) -> Response:
    """A snapshot's delete (E2B's template delete): 204, or 404 (the SDK's ``False``). A
    Ringfence template is not deleted through this door (400)."""
    context, principal = await caller(request, x_api_key)
    snapshot_id = snapshot_named(template_id)
    if snapshot_id is None:
        try:
            context.sandboxes.image_for(template_id)
        except TemplateNotFound:
            raise CheckpointNotFound(f"no snapshot with id {template_id!r}") from None
        raise InvalidRequest(
            f"templates: {template_id!r} is a Ringfence template; templates are not managed "
            "through E2B's API (ringfence template ...)"
        )
    await context.sandboxes.state.delete_snapshot(
        principal.tenant, snapshot_id, actor=principal.key_id
    )
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
async def fork(
    sandbox_id: SandboxId,
    request: Request,
    body: ForkRequest | None = None,
    x_api_key: ApiKey = None,
) -> JSONResponse:
    """One entry per child asked for: ``{"sandbox"}``, or ``{"error"}`` in every entry when
    they could not all start (none was kept). An unknown or ended parent is 404."""
    context, principal = await caller(request, x_api_key)
    body = body or ForkRequest()
    if body.count > MAX_FORK_CHILDREN:
        raise InvalidRequest(f"count: a fork makes at most {MAX_FORK_CHILDREN} children here")
    await _present(context, principal, sandbox_id)
    state = context.sandboxes.state
    try:
        forked = await _unsupported_as_invalid(
            state.fork(principal.tenant, sandbox_id, body.count, actor=principal.key_id)
        )
    except SandboxNotRunning:
        raise await _not_running(context, principal, sandbox_id) from None
    except (InvalidRequest, SandboxNotFound):
        raise
    except RingfenceError as exc:  # no room, or a child did not start: none was made
        status = HTTP_STATUS.get(exc.code, 500)
        failed = {"error": {"code": status, "message": exc.message}}
        return JSONResponse([failed] * body.count, status_code=201)
    entries = [await _child(context, principal, child, body.timeout) for child in forked.children]
    return JSONResponse(entries, status_code=201)


async def _child(
    context: E2bContext, principal: Principal, child: Sandbox, timeout: int
) -> dict[str, Any]:
    """A fork's entry for ``child``, given E2B's time to live."""
    try:
        child = await context.sandboxes.set_timeout(
            principal.tenant, child.id, timeout, actor=principal.key_id
        )
    except SandboxNotRunning as exc:
        return {"error": {"code": 404, "message": exc.message}}
    return {"sandbox": answer(context, principal, child).model_dump(mode="json")}


async def _present(context: E2bContext, principal: Principal, sandbox_id: str) -> Sandbox:
    """The sandbox, running or paused. Raises ``SandboxNotFound`` (ended ones too)."""
    sandbox = await context.sandboxes.get(principal.tenant, sandbox_id)
    if sandbox.state.is_terminal:
        raise gone(sandbox_id)
    return sandbox


async def _not_running(
    context: E2bContext, principal: Principal, sandbox_id: str
) -> RingfenceError:
    """Why the sandbox could not be reached: it is paused (and made without auto_resume:
    409, connect first) or it has ended (404)."""
    try:
        sandbox = await context.sandboxes.get(principal.tenant, sandbox_id)
    except SandboxNotFound:
        return gone(sandbox_id)
    if sandbox.state is SandboxState.PAUSED:
        return Conflict(f"sandbox {sandbox_id} is paused: connect to it first (it resumes)")
    return gone(sandbox_id)


async def _unhealthy(
    context: E2bContext, principal: Principal, sandbox_id: str
) -> JSONResponse | None:
    """A 503 if the sandbox's daemon does not answer within a few seconds (else None)."""
    try:
        daemon = await context.sandboxes.daemon(principal.tenant, sandbox_id)
        await daemon.health(_HEALTH_SECONDS)
    except SandboxNotRunning:
        return error_response(
            503, f"sandbox {sandbox_id}'s daemon does not answer: it was not paused"
        )
    return None


async def _unsupported_as_invalid(pending: Awaitable[T]) -> T:
    """Await a service call; a backend that cannot capture state is E2B's 400 for an
    unsupported option (its 409 would read as "already paused" to the SDK)."""
    try:
        return await pending
    except StateUnsupported as exc:
        raise InvalidRequest(exc.message) from None


def _snapshot_info(snapshot: Snapshot) -> dict[str, Any]:
    return {"snapshotID": snapshot.id, "names": []}


def _number(raw: str | None, name: str, *, default: int, ceiling: int | None) -> int:
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or (ceiling is not None and not 1 <= int(raw) <= ceiling):
        bound = f"1-{ceiling}" if ceiling is not None else "a token this server handed out"
        raise InvalidRequest(f"{name} must be {bound}, got {raw!r}")
    return int(raw)
