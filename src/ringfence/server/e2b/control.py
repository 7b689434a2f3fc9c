"""E2B's control plane (``X-API-KEY``): create, connect, list, get, set_timeout, kill;
pause, snapshots and fork are ``server.e2b.state``'s (included first).

Each route calls the same service methods as the native API, so tenancy, policy ceilings
and the audit record are the native ones. E2B sees running and paused sandboxes: an ended
one is "not found" here (404), which the SDK turns into ``SandboxNotFoundException`` (or
``False`` from ``kill``). Create and connect hand the calling key this sandbox's access
tokens; connect resumes a paused one.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Annotated
from urllib.parse import parse_qsl, unquote

from fastapi import APIRouter, Header, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from ringfence.errors import InvalidRequest, SandboxNotFound, SandboxNotRunning
from ringfence.models import Sandbox, SandboxSpec, SandboxState
from ringfence.server.e2b import metrics, network, state, volumes
from ringfence.server.e2b.context import E2bContext
from ringfence.server.e2b.context import answer as _answer
from ringfence.server.e2b.context import caller as _caller
from ringfence.server.e2b.context import gone as _gone
from ringfence.server.e2b.models import (
    ConnectRequest,
    E2bSandbox,
    ListedSandbox,
    NewSandbox,
    SandboxDetail,
    TimeoutRequest,
    e2b_template,
    listed,
)
from ringfence.server.e2b.tokens import Grant, Purpose
from ringfence.service.keys import Principal
from ringfence.templates import TemplateNotFound

__all__ = ["router"]

router = APIRouter()
router.include_router(state.router)  # before this module's catch-alls for what is missing
router.include_router(network.router)
router.include_router(volumes.router)
router.include_router(metrics.router)

SandboxId = Annotated[str, Path(max_length=64)]
ApiKey = Annotated[str | None, Header(alias="X-API-KEY")]

# E2B's template names → Ringfence's. The alias is used when that template is built here;
# otherwise "base" (the host's system directories, which the code interpreter runs on).
_ALIASES = {"code-interpreter-v1": "code-interpreter"}
_FALLBACK = "base"
_SWEEP_SLACK = 256  # grants remembered beyond twice the running sandboxes before a sweep
_LIST_CEILING = 10_000  # sandboxes of one tenant considered by one list request


def _template(context: E2bContext, name: str) -> str:
    alias = _ALIASES.get(name)
    if alias is None:
        return name
    try:
        context.sandboxes.image_for(alias)
    except TemplateNotFound:
        return _FALLBACK
    return alias


def _refuse_unsupported(body: NewSandbox) -> None:
    """What E2B offers and Ringfence cannot honour yet is refused, never dropped (network
    options: ``server.e2b.network``)."""
    if body.mcp:
        raise InvalidRequest("mcp: the MCP gateway template is not supported")
    if (body.iam or {}).get("tokens"):
        raise InvalidRequest("iam: workload identity tokens are not supported")


@router.post("/v2/sandboxes", status_code=201)
@router.post("/sandboxes", status_code=201)
async def create(body: NewSandbox, request: Request, x_api_key: ApiKey = None) -> E2bSandbox:
    context, caller = await _caller(request, x_api_key)
    _refuse_unsupported(body)
    snapshot = state.snapshot_named(body.templateID)
    source = (
        {"snapshot": snapshot} if snapshot else {"template": _template(context, body.templateID)}
    )
    egress = await network.off_loop(
        network.create_fields,
        body.allow_internet_access, body.network, caller.tenant, context.sandboxes.config,
    )  # fmt: skip
    try:
        spec = SandboxSpec(
            **source,
            timeout=body.timeout,
            env=body.envVars or {},
            metadata=body.metadata or {},
            volumes=volumes.mounts_of(body.volumeMounts),
            **state.lifecycle_of(body),
            **egress,
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequest(problems) from None
    sandbox = await context.sandboxes.create(caller.tenant, spec, actor=caller.key_id)
    await _forget_ended_when_many(context)
    return _answer(context, caller, sandbox)


@router.post("/v2/sandboxes/{sandbox_id}/connect")
@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
async def connect(
    sandbox_id: SandboxId, body: ConnectRequest, request: Request, x_api_key: ApiKey = None
) -> E2bSandbox:
    """A running sandbox, with tokens for the calling key; a paused one is resumed first
    (``memory`` false: cold, from its files). A timeout only ever extends a running one (as
    E2B's connect does); a resumed one lives that long from now (E2B's default 5 minutes)."""
    context, caller = await _caller(request, x_api_key)
    sandbox, resumed = await state.awaken(
        context, caller, sandbox_id, memory=body.memory, auto_pause=body.autoPause
    )
    timeout: float | None = body.timeout
    if resumed and timeout is None:
        timeout = state.resumed_timeout(context)
    if timeout is not None:
        wanted = datetime.now(UTC) + timedelta(seconds=timeout)
        if resumed or sandbox.expires_at is None or wanted > sandbox.expires_at:
            sandbox = await _live(
                context.sandboxes.set_timeout(
                    caller.tenant, sandbox_id, timeout, actor=caller.key_id
                ),
                sandbox_id,
            )
    context.sandboxes.record(caller.tenant, caller.key_id, "sandbox.connect", sandbox_id)
    await _forget_ended_when_many(context)
    return _answer(context, caller, sandbox)


@router.get("/sandboxes/{sandbox_id}")
async def get_info(
    sandbox_id: SandboxId, request: Request, x_api_key: ApiKey = None
) -> JSONResponse:
    context, caller = await _caller(request, x_api_key)
    sandbox = await _running(context, caller, sandbox_id, paused=True)
    await _forget_ended_when_many(context)
    grant = Grant(caller.tenant, caller.key_id, caller.generation, sandbox.id)
    detail = SandboxDetail(
        **listed(sandbox),
        envdAccessToken=context.grants.token(grant, Purpose.ENVD),
        lifecycle=state.lifecycle(sandbox),
    )
    return JSONResponse(detail.model_dump(mode="json"))


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(
    sandbox_id: SandboxId, body: TimeoutRequest, request: Request, x_api_key: ApiKey = None
) -> Response:
    context, caller = await _caller(request, x_api_key)
    await _live(
        context.sandboxes.set_timeout(caller.tenant, sandbox_id, body.timeout, actor=caller.key_id),
        sandbox_id,
    )
    return Response(status_code=204)


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(sandbox_id: SandboxId, request: Request, x_api_key: ApiKey = None) -> Response:
    """204 once nothing of it remains (a paused one too); 404 for an ended or unknown one
    (``kill`` → False)."""
    context, caller = await _caller(request, x_api_key)
    await _running(context, caller, sandbox_id, paused=True)
    killed = await context.sandboxes.kill(caller.tenant, sandbox_id, actor=caller.key_id)
    context.grants.forget(sandbox_id)
    if killed.state is not SandboxState.KILLED:
        raise _gone(sandbox_id)  # it ended by itself meanwhile
    return Response(status_code=204)


@router.get("/v2/sandboxes")
@router.get("/sandboxes")
async def list_sandboxes(request: Request, x_api_key: ApiKey = None) -> JSONResponse:
    """Running and paused sandboxes (``state`` picks either), filtered by ``metadata``
    (E2B encodes it twice), ``template`` and ``startedAfter``, ordered by ``order`` (desc
    by default), a page of ``limit`` at a time (``x-next-token``)."""
    context, caller = await _caller(request, x_api_key)
    query = request.query_params
    asked = {s for item in query.getlist("state") for s in item.split(",") if s}
    shown = [s for s in (SandboxState.RUNNING, SandboxState.PAUSED) if not asked or s in asked]
    if not shown:
        return JSONResponse([])
    found = await context.sandboxes.list(
        caller.tenant,
        states=shown,
        metadata=_metadata_filter(query.get("metadata")),
        limit=_LIST_CEILING,
    )
    template = query.get("template")
    if template:
        wanted = state.snapshot_named(template) or _template(context, template)
        found = [s for s in found if e2b_template(s) == wanted]
    started_after = _time(query.get("startedAfter"), "startedAfter")
    if started_after is not None:
        found = [s for s in found if s.created_at >= started_after]  # at or after, as E2B
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest(f"order must be asc or desc, got {order!r}")
    found.sort(key=lambda s: (s.created_at, s.id), reverse=order == "desc")
    start = _offset(query.get("nextToken"))
    limit = _limit(query.get("limit"))
    page = found[start : start + limit]
    items = [ListedSandbox(**listed(s)).model_dump(mode="json") for s in page]
    response = JSONResponse(items)
    if start + limit < len(found):
        response.headers["x-next-token"] = str(start + limit)
    return response


@router.api_route(
    "/sandboxes/{sandbox_id}/{feature}", methods=["GET", "POST", "PUT"], status_code=400
)
async def unsupported(
    sandbox_id: SandboxId, feature: str, request: Request, x_api_key: ApiKey = None
) -> JSONResponse:
    """The rest: not (yet) in Ringfence (pause, snapshots and fork are
    ``server.e2b.state``'s, the network ``server.e2b.network``'s, metrics
    ``server.e2b.metrics``', matched first)."""
    await _caller(request, x_api_key)
    raise InvalidRequest(f"{feature}: not supported by Ringfence's E2B compatibility yet")


_EVERY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@router.api_route("/templates/{name:path}", methods=_EVERY_METHOD, status_code=400)
@router.api_route("/v{version:int}/templates", methods=_EVERY_METHOD, status_code=400)
@router.api_route("/v{version:int}/templates/{name:path}", methods=_EVERY_METHOD, status_code=400)
async def unsupported_collection(request: Request, x_api_key: ApiKey = None) -> JSONResponse:
    """E2B's template builds and management: not (yet) in Ringfence, said in E2B's error
    shape (a snapshot's delete is ``server.e2b.state``'s, matched first)."""
    await _caller(request, x_api_key)
    parts = request.url.path.strip("/").split("/")
    what = parts[1] if parts[0].startswith("v") and parts[0][1:].isdigit() else parts[0]
    raise InvalidRequest(f"{what}: not supported by Ringfence's E2B compatibility yet")


async def _forget_ended_when_many(context: E2bContext) -> None:
    """Every door that hands out tokens (create, connect, get_info) sweeps once the grants
    outnumber what the running sandboxes explain: a signed URL's miss costs one hash each.
    Paused sandboxes keep their grants, so a sweep also waits until the grants have doubled
    since the last one kept (each grant costs a store read: amortized, never per call)."""
    explained = 2 * context.sandboxes.running_count() + _SWEEP_SLACK
    if len(context.grants) > max(explained, 2 * context.sweep.kept):
        await _forget_ended(context)
        context.sweep.kept = len(context.grants)


async def _forget_ended(context: E2bContext) -> None:
    """Drop the grants of sandboxes that ended without a kill through this door (expired,
    killed natively): signed URLs are resolved by trying each remembered grant. A paused
    sandbox keeps its grants (and is not resumed by the look)."""
    for grant in context.grants.issued():
        try:
            sandbox = await context.sandboxes.get(grant.tenant, grant.sandbox_id)
        except SandboxNotFound:
            sandbox = None
        if sandbox is None or sandbox.state.is_terminal:
            context.grants.forget(grant.sandbox_id)


async def _running(
    context: E2bContext, caller: Principal, sandbox_id: str, *, paused: bool = False
) -> Sandbox:
    """The sandbox if running (or paused, with ``paused``); else "not found"."""
    sandbox = await context.sandboxes.get(caller.tenant, sandbox_id)
    if sandbox.state is not SandboxState.RUNNING and not (
        paused and sandbox.state is SandboxState.PAUSED
    ):
        raise _gone(sandbox_id)
    return sandbox


async def _live(pending: Awaitable[Sandbox], sandbox_id: str) -> Sandbox:
    """Await a service call on a running sandbox; its end becomes "not found"."""
    try:
        return await pending
    except SandboxNotRunning:
        raise _gone(sandbox_id) from None


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """``k=v&k2=v2`` with each key and value URL-encoded once more (E2B's double encoding)."""
    if not raw:
        return {}
    try:
        pairs = parse_qsl(raw, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise InvalidRequest(
            f"metadata must be key=value pairs joined by '&', got {raw!r}"
        ) from None
    return {unquote(key): unquote(value) for key, value in pairs}


def _time(raw: str | None, name: str) -> datetime | None:
    if not raw:
        return None
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"{name} must be an ISO 8601 time, got {raw!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _offset(raw: str | None) -> int:
    if not raw:
        return 0
    if not raw.isdigit():
        raise InvalidRequest(f"nextToken {raw!r} is not one this server handed out")
    return int(raw)


def _limit(raw: str | None) -> int:
    if raw is None:
        return 100
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise InvalidRequest(f"limit must be 1-1000, got {raw!r}")
    return int(raw)
