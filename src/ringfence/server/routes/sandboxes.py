"""``/v1/sandboxes``: interactive sandboxes, their commands and their files.

Commands and the filesystem speak the sandbox daemon's own protocol (E2B envd's Connect RPC
with the JSON codec), passed through to the daemon after the caller's key and tenant are
checked: ``POST /v1/sandboxes/{id}/rpc/process.Process/Start`` is the daemon's
``POST /process.Process/Start``. Files move as raw bytes on ``/v1/sandboxes/{id}/files``.
Bodies stream both ways; nothing is buffered whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask

from ringfence.errors import InvalidRequest, SandboxNotRunning
from ringfence.models import MAX_TIMEOUT_SECONDS, Sandbox, SandboxSpec, SandboxState
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody
from ringfence.server.routes.executions import BUDGET_ERRORS
from ringfence.service.daemon_client import (
    FORWARDED_RESPONSE_HEADERS,
    DaemonClient,
    DaemonResponse,
)
from ringfence.service.sandboxes import SandboxService

__all__ = ["ORIGIN_HEADER", "STREAMED_PATHS", "answer_headers", "router"]

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"])

ORIGIN_HEADER = "Ringfence-Origin"
# The daemon's answers: its protocols' types pass on, any other becomes opaque bytes.
_PASSED_TYPES = frozenset(
    {"application/json", "application/connect+json", "application/octet-stream"}
)
# On every answer from a sandbox: no browser sniffs it into a page or runs it as one.
_INERT = {"x-content-type-options": "nosniff", "content-security-policy": "sandbox"}
# Bodies these routes pass through as they come (bounded by the sandbox's own limits).
STREAMED_PATHS = re.compile(r"/v1/sandboxes/[^/]+/(files|rpc/process\.Process/StreamInput)")

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such sandbox in your tenant"},
}
_ELSEWHERE: dict[int | str, dict[str, object]] = {
    421: {
        "model": ErrorBody,
        "description": "Another server replica runs the sandbox (sandbox_on_another_replica)",
    },
}
_LIVE_ERRORS: dict[int | str, dict[str, object]] = {
    **_ERRORS,
    **_ELSEWHERE,
    409: {"model": ErrorBody, "description": "The sandbox has ended (sandbox_not_running)"},
}

SandboxId = Annotated[str, Path(max_length=64, description="The sandbox's id.")]


class Timeout(BaseModel):
    timeout: float = Field(
        gt=0, le=MAX_TIMEOUT_SECONDS, description="Seconds from now until the sandbox is killed."
    )


class Service(StrEnum):
    """The daemon's RPC services (E2B envd's)."""

    PROCESS = "process.Process"
    FILESYSTEM = "filesystem.Filesystem"


def _body(description: str, *media_types: str) -> dict[str, object]:
    """An OpenAPI request body for a route that streams its body instead of parsing it (a
    declared body parameter would make FastAPI read it whole first)."""
    content = {
        media_type: {"schema": {"type": "string", "format": "binary"}} for media_type in media_types
    }
    return {"requestBody": {"description": description, "content": content}}


def _service(request: Request) -> SandboxService:
    service: SandboxService = request.app.state.sandboxes
    return service


@router.post(
    "",
    response_model=Sandbox,
    status_code=201,
    responses={
        **_ERRORS,
        **BUDGET_ERRORS,
        500: {"model": ErrorBody, "description": "The sandbox failed to start"},
    },
    summary="Create an interactive sandbox",
)
async def create_sandbox(body: SandboxSpec, caller: Caller, request: Request) -> Sandbox:
    """Answers once the sandbox's daemon is ready for commands and files. The sandbox lives
    until its timeout (default 300 s) or a kill; then nothing of it remains."""
    return await _service(request).create(caller.tenant, body, actor=caller.key_id)


@router.get(
    "",
    response_model=list[Sandbox],
    responses=_ERRORS,
    summary="List your sandboxes, newest first",
)
async def list_sandboxes(
    caller: Caller,
    request: Request,
    state: Annotated[
        list[SandboxState] | None, Query(description="Only sandboxes in these states.")
    ] = None,
    metadata: Annotated[
        list[str] | None,
        Query(description="key=value: only sandboxes with this metadata (repeat for more)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[Sandbox]:
    wanted = dict(_pair(item) for item in metadata or [])
    return await _service(request).list(
        caller.tenant, states=state or None, metadata=wanted, limit=limit
    )


@router.get(
    "/{sandbox_id}", response_model=Sandbox, responses=_ERRORS, summary="One of your sandboxes"
)
async def get_sandbox(sandbox_id: SandboxId, caller: Caller, request: Request) -> Sandbox:
    return await _service(request).get(caller.tenant, sandbox_id)


@router.post(
    "/{sandbox_id}/timeout",
    response_model=Sandbox,
    responses=_LIVE_ERRORS,
    summary="Kill the sandbox this many seconds from now",
)
async def set_timeout(
    sandbox_id: SandboxId, body: Timeout, caller: Caller, request: Request
) -> Sandbox:
    """Earlier or later than before; the clock starts now."""
    return await _service(request).set_timeout(
        caller.tenant, sandbox_id, body.timeout, actor=caller.key_id
    )


@router.delete(
    "/{sandbox_id}",
    response_model=Sandbox,
    responses={**_ERRORS, **_ELSEWHERE},
    summary="Kill the sandbox: every process, and everything it wrote",
)
async def kill_sandbox(sandbox_id: SandboxId, caller: Caller, request: Request) -> Sandbox:
    """Answers once nothing of it remains; killing an ended sandbox returns it unchanged."""
    return await _service(request).kill(caller.tenant, sandbox_id, actor=caller.key_id)


@router.post(
    "/{sandbox_id}/rpc/{service}/{method}",
    responses={
        **_LIVE_ERRORS,
        200: {
            "description": "The daemon's answer: `application/json` for unary calls, "
            "`application/connect+json` envelopes for streams (Start, Connect, WatchDir)",
            "content": {"application/json": {}, "application/connect+json": {}},
        },
    },
    summary="Call the sandbox daemon (processes and filesystem; E2B envd's Connect RPC)",
    openapi_extra=_body(
        "The request message: JSON for unary calls, one Connect envelope "
        "(application/connect+json) for streams. Methods: process.Process/{Start, Connect, "
        "List, SendInput, StreamInput, SendSignal, CloseStdin}, filesystem.Filesystem/{Stat, "
        "ListDir, MakeDir, Move, Remove, WatchDir, CreateWatcher, GetWatcherEvents, "
        "RemoveWatcher}.",
        "application/json",
        "application/connect+json",
    ),
)
async def call_daemon(
    sandbox_id: SandboxId,
    service: Service,
    method: Annotated[str, Path(pattern=r"^[A-Za-z]{1,64}$")],
    caller: Caller,
    request: Request,
) -> StreamingResponse:
    sandboxes = _service(request)
    daemon = await sandboxes.daemon(caller.tenant, sandbox_id)
    if method not in _CHANGING[service]:
        return await _forward(daemon, request, "POST", f"/{service.value}/{method}")
    if (service, method) == (Service.PROCESS, "StreamInput"):  # a stream: passed on as it comes
        sandboxes.record(caller.tenant, caller.key_id, f"sandbox.{method}", sandbox_id)
        return await _forward(daemon, request, "POST", f"/{service.value}/{method}")
    body = await request.body()  # bounded by the body limit
    details = _audited(method, body)
    sandboxes.record(caller.tenant, caller.key_id, f"sandbox.{method}", sandbox_id, details=details)
    return await _forward(daemon, request, "POST", f"/{service.value}/{method}", content=body)


@router.get(
    "/{sandbox_id}/files",
    responses={
        **_LIVE_ERRORS,
        200: {
            "description": "The file's bytes",
            "content": {"application/octet-stream": {}},
        },
    },
    summary="Download a file from the sandbox (streamed)",
)
async def read_file(
    sandbox_id: SandboxId,
    caller: Caller,
    request: Request,
    path: Annotated[str, Query(description="Path in the sandbox; relative to the home.")],
) -> StreamingResponse:
    daemon = await _service(request).daemon(caller.tenant, sandbox_id)
    return await _forward(daemon, request, "GET", "/files", {"path": path})


@router.put(
    "/{sandbox_id}/files",
    responses={
        **_LIVE_ERRORS,
        200: {"description": "`[{name, type, path}]` of the file written"},
        507: {"description": "The sandbox's disk is full"},
    },
    summary="Upload a file into the sandbox (streamed; replaces it whole at the end)",
    openapi_extra=_body(
        "The file's bytes (optionally Content-Encoding: gzip).", "application/octet-stream"
    ),
)
async def write_file(
    sandbox_id: SandboxId,
    caller: Caller,
    request: Request,
    path: Annotated[str, Query(description="Path in the sandbox; parents are created.")],
) -> StreamingResponse:
    sandboxes = _service(request)
    daemon = await sandboxes.daemon(caller.tenant, sandbox_id)
    sandboxes.record(
        caller.tenant, caller.key_id, "sandbox.write_file", sandbox_id, details={"path": path}
    )
    return await _forward(daemon, request, "POST", "/files", {"path": path})


@router.post(
    "/{sandbox_id}/code/execute",
    responses={
        **_LIVE_ERRORS,
        200: {
            "description": "JSON lines as they come: stdout, stderr, result (a MIME bundle: "
            "text, html, png, json...), error (name, value, traceback), "
            "number_of_executions, end_of_execution",
            "content": {"application/json": {}},
        },
    },
    summary="Run code in a persistent context (Python by default; bash too)",
    openapi_extra=_body(
        '{"code": "x + 1", "context_id"?: "...", "language"?: "python"|"bash", '
        '"env_vars"?: {}, "timeout"?: seconds}: a context keeps its state between calls; '
        "at the timeout the cell is interrupted (KeyboardInterrupt) and the context kept.",
        "application/json",
    ),
)
async def execute_code(
    sandbox_id: SandboxId, caller: Caller, request: Request
) -> StreamingResponse:
    sandboxes = _service(request)
    daemon = await sandboxes.daemon(caller.tenant, sandbox_id)
    body = await request.body()
    message = _message(body)
    details = {
        "code": _clip(str(message.get("code", ""))),
        "context_id": message.get("context_id"),
        "language": message.get("language"),
    }
    sandboxes.record(caller.tenant, caller.key_id, "sandbox.run_code", sandbox_id, details=details)
    return await _forward(daemon, request, "POST", "/execute", content=body)


@router.get(
    "/{sandbox_id}/code/contexts",
    responses=_LIVE_ERRORS,
    summary="List code contexts: [{id, language, cwd}]",
)
async def list_contexts(
    sandbox_id: SandboxId, caller: Caller, request: Request
) -> StreamingResponse:
    daemon = await _service(request).daemon(caller.tenant, sandbox_id)
    return await _forward(daemon, request, "GET", "/contexts")


@router.post(
    "/{sandbox_id}/code/contexts",
    responses=_LIVE_ERRORS,
    summary="Create a code context: {language?: python|bash, cwd?} -> {id, language, cwd}",
)
async def create_context(
    sandbox_id: SandboxId, caller: Caller, request: Request
) -> StreamingResponse:
    sandboxes = _service(request)
    daemon = await sandboxes.daemon(caller.tenant, sandbox_id)
    sandboxes.record(caller.tenant, caller.key_id, "sandbox.create_context", sandbox_id)
    return await _forward(daemon, request, "POST", "/contexts")


@router.api_route(
    "/{sandbox_id}/code/contexts/{context_id}",
    methods=["DELETE"],
    responses=_LIVE_ERRORS,
    summary="Remove a code context (its interpreter and state)",
)
async def remove_context(
    sandbox_id: SandboxId,
    context_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")],
    caller: Caller,
    request: Request,
) -> StreamingResponse:
    sandboxes = _service(request)
    daemon = await sandboxes.daemon(caller.tenant, sandbox_id)
    sandboxes.record(
        caller.tenant, caller.key_id, "sandbox.remove_context", sandbox_id,
        details={"context_id": context_id},
    )  # fmt: skip
    return await _forward(daemon, request, "DELETE", f"/contexts/{context_id}")


@router.post(
    "/{sandbox_id}/code/contexts/{context_id}/restart",
    responses=_LIVE_ERRORS,
    summary="Restart a code context: a fresh interpreter, its state dropped",
)
async def restart_context(
    sandbox_id: SandboxId,
    context_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")],
    caller: Caller,
    request: Request,
) -> StreamingResponse:
    sandboxes = _service(request)
    daemon = await sandboxes.daemon(caller.tenant, sandbox_id)
    sandboxes.record(
        caller.tenant, caller.key_id, "sandbox.restart_context", sandbox_id,
        details={"context_id": context_id},
    )  # fmt: skip
    return await _forward(daemon, request, "POST", f"/contexts/{context_id}/restart", content=b"")


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise InvalidRequest(f"metadata filter must be key=value, got {item!r}")
    return key, value


# The daemon calls that change something: each goes on the audit record.
_CHANGING = {
    Service.PROCESS: {"Start", "SendInput", "StreamInput", "SendSignal", "CloseStdin", "Update"},
    Service.FILESYSTEM: {"MakeDir", "Move", "Remove"},
}
_AUDITED_TEXT = 2048  # characters of a command line or path kept in the record


def _audited(method: str, body: bytes) -> dict[str, object]:
    """What the audit keeps of a daemon call: the command line, paths, the signal; never
    stdin or environment values. The body is the client's: parsed leniently, bounded."""
    message = _message(body)
    if method == "Start":
        process = message.get("process") if isinstance(message.get("process"), dict) else {}
        assert isinstance(process, dict)
        words = [process.get("cmd"), *(process.get("args") or [])]
        envs = process.get("envs")
        return {
            "command": _clip(" ".join(str(word) for word in words if word is not None)),
            "cwd": _clip(str(process.get("cwd") or "")),
            "env": sorted(envs)[:100] if isinstance(envs, dict) else [],
        }
    if method == "SendInput":
        return {"process": message.get("process"), "bytes": len(body)}
    return {
        name: _clip(str(message[name]))
        for name in ("path", "source", "destination", "process", "signal")
        if name in message
    }


def _message(body: bytes) -> dict[str, object]:
    payload = body[5:] if body[:1] in (b"\x00", b"\x01") else body  # a Connect envelope
    try:
        message = json.loads(payload)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def _clip(text: str) -> str:
    return text if len(text) <= _AUDITED_TEXT else text[:_AUDITED_TEXT] + "…"


async def _forward(
    daemon: DaemonClient,
    request: Request,
    method: str,
    path: str,
    params: dict[str, str] | None = None,
    content: bytes | None = None,
) -> StreamingResponse:
    """Pass the request's body (or ``content``, when it was read already) to the daemon and
    its answer back, both streamed."""
    body: AsyncIterable[bytes] | bytes | None = content
    if body is None and method not in ("GET", "DELETE"):
        body = request.stream()
    upstream = await daemon.send(method, path, params=params, headers=request.headers, content=body)
    download = method == "GET" and path == "/files" and upstream.status_code == 200
    return StreamingResponse(
        _relay(upstream),
        status_code=upstream.status_code,
        headers=answer_headers(upstream.headers, upstream.content_length, download=download),
        background=BackgroundTask(upstream.aclose),
    )


def answer_headers(
    upstream: Iterable[tuple[str, str]], content_length: str | None, *, download: bool
) -> dict[str, str]:
    """The headers of a daemon's answer as the server passes it on.

    The daemon runs as the sandbox's user: its answer may be anything, served from the
    server's origin (where the approval console lives). So no browser may run or sniff it
    (``nosniff``, a CSP ``sandbox``), a type outside the daemon's own protocols becomes opaque
    bytes, and a downloaded file is always an attachment of opaque bytes.
    """
    headers = {
        name.lower(): value
        for name, value in upstream
        if name.lower() in FORWARDED_RESPONSE_HEADERS
    }
    kind = headers.get("content-type", "").partition(";")[0].strip().lower()
    if download or kind not in _PASSED_TYPES:
        headers["content-type"] = "application/octet-stream"
    if download:
        headers["content-disposition"] = "attachment"
    if content_length is not None:
        headers["content-length"] = content_length
    headers.update(_INERT)
    # What the daemon says is the sandboxed code's word: mark it, so that no client takes a
    # daemon's {"error": {"code": "unauthenticated"}} for the server's own.
    headers[ORIGIN_HEADER] = "sandbox"
    return headers


async def _relay(upstream: DaemonResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except SandboxNotRunning:
        return  # the sandbox ended mid-answer: the client sees the body cut short
    finally:
        await upstream.aclose()
