"""``/v1/sandboxes``: interactive sandboxes, their commands and their files.

Commands and the filesystem speak the sandbox daemon's own protocol (E2B envd's Connect RPC
with the JSON codec), passed through to the daemon after the caller's key and tenant are
checked: ``POST /v1/sandboxes/{id}/rpc/process.Process/Start`` is the daemon's
``POST /process.Process/Start``. Files move as raw bytes on ``/v1/sandboxes/{id}/files``.
Bodies stream both ways; nothing is buffered whole.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from enum import StrEnum
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask

from ringfence.errors import InvalidRequest, NotFound, SandboxError, SandboxNotRunning
from ringfence.models import MAX_TIMEOUT_SECONDS, Env, Sandbox, SandboxSpec, SandboxState
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody, shown
from ringfence.server.routes.executions import BUDGET_ERRORS
from ringfence.service.daemon_client import (
    FORWARDED_RESPONSE_HEADERS,
    DaemonClient,
    DaemonResponse,
)
from ringfence.service.sandboxes import SandboxService

__all__ = ["ORIGIN_HEADER", "STREAMED_PATHS", "answer_headers", "router", "sandbox_error"]

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
_ENDED: dict[int | str, dict[str, object]] = {
    409: {"model": ErrorBody, "description": "The sandbox has ended (sandbox_not_running)"},
}
# Routes passed through to the sandbox's daemon: its refusals too, marked
# `Ringfence-Origin: sandbox` (see ``sandbox_error``).
_LIVE_ERRORS: dict[int | str, dict[str, object]] = {
    **_ERRORS,
    **_ELSEWHERE,
    **_ENDED,
    400: {
        "model": ErrorBody,
        "description": "Invalid request (invalid_request): refused by the server, or by the "
        "sandbox (a directory where a file is expected, a read-only or existing path, a "
        "method the daemon does not have, a malformed message)",
    },
    404: {
        "model": ErrorBody,
        "description": "No such sandbox in your tenant; or, from the sandbox, no such file, "
        "process or code context there (not_found)",
    },
    429: {
        "model": ErrorBody,
        "description": "Too many requests in flight to the sandbox (too_many_requests), or "
        "the sandbox ran out of something: watches, contexts (resource_exhausted)",
    },
    502: {
        "model": ErrorBody,
        "description": "The sandbox failed, or answered something the server does not pass "
        "on (sandbox_error)",
    },
}

SandboxId = Annotated[str, Path(max_length=64, description="The sandbox's id.")]
# A file's path: not empty, no NUL, within the kernel's PATH_MAX.
SandboxPath = functools.partial(Query, min_length=1, max_length=4095, pattern=r"^[^\x00]+$")


class Timeout(BaseModel):
    timeout: float = Field(
        gt=0, le=MAX_TIMEOUT_SECONDS, description="Seconds from now until the sandbox is killed."
    )


class Service(StrEnum):
    """The daemon's RPC services (E2B envd's)."""

    PROCESS = "process.Process"
    FILESYSTEM = "filesystem.Filesystem"


# The languages of code contexts (javascript where the template has node).
Language = Literal["python", "bash", "javascript"]


class CodeRequest(BaseModel):
    """A cell to run (the document's schema: the daemon reads the body itself)."""

    code: str = Field(max_length=1 << 19, description="The code to run.")
    context_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_-]{1,64}$", description="A context of this sandbox."
    )
    language: Language | None = Field(
        None, description="Its language's default context (not with context_id)."
    )
    env_vars: Env = Field(default_factory=dict, description="Variables of this cell only.")
    timeout: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_SECONDS, description="Seconds; then it is interrupted."
    )


class ContextRequest(BaseModel):
    """A code context to create (the document's schema)."""

    language: Language | None = Field(None, description="Default python.")
    cwd: str | None = Field(None, min_length=1, max_length=4095, pattern=r"^[^\x00]+$")


def _body(
    description: str, *media_types: str, model: type[BaseModel] | None = None
) -> dict[str, object]:
    """An OpenAPI request body for a route that streams its body instead of parsing it (a
    declared body parameter would make FastAPI read it whole first); ``model`` is its
    schema when it is JSON."""
    binary = {"type": "string", "format": "binary"}
    schema = binary if model is None else model.model_json_schema()
    content = {media_type: {"schema": schema} for media_type in media_types}
    return {"requestBody": {"description": description, "content": content, "required": True}}


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
    return shown(request, await _service(request).create(caller.tenant, body, actor=caller.key_id))


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
        list[Annotated[str, Field(pattern=r"^[^=]{1,128}=")]] | None,
        Query(description="key=value: only sandboxes with this metadata (repeat for more)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[Sandbox]:
    wanted = dict(_pair(item) for item in metadata or [])
    found = await _service(request).list(
        caller.tenant, states=state or None, metadata=wanted, limit=limit
    )
    return [shown(request, sandbox) for sandbox in found]


@router.get(
    "/{sandbox_id}", response_model=Sandbox, responses=_ERRORS, summary="One of your sandboxes"
)
async def get_sandbox(sandbox_id: SandboxId, caller: Caller, request: Request) -> Sandbox:
    return shown(request, await _service(request).get(caller.tenant, sandbox_id))


@router.post(
    "/{sandbox_id}/timeout",
    response_model=Sandbox,
    responses={**_ERRORS, **_ELSEWHERE, **_ENDED},
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
    return shown(
        request, await _service(request).kill(caller.tenant, sandbox_id, actor=caller.key_id)
    )


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
) -> Response:
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
    path: Annotated[str, SandboxPath(description="Path in the sandbox; relative to the home.")],
) -> Response:
    daemon = await _service(request).daemon(caller.tenant, sandbox_id)
    return await _forward(daemon, request, "GET", "/files", {"path": path})


@router.put(
    "/{sandbox_id}/files",
    responses={
        **_LIVE_ERRORS,
        200: {"description": "`[{name, type, path}]` of the file written"},
        507: {"model": ErrorBody, "description": "The sandbox's disk is full (resource_exhausted)"},
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
    path: Annotated[str, SandboxPath(description="Path in the sandbox; parents are created.")],
) -> Response:
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
            "content": {"application/x-ndjson": {}},
        },
    },
    summary="Run code in a persistent context (Python by default; bash too)",
    openapi_extra=_body(
        '{"code": "x + 1", "context_id"?: "...", "language"?: "python"|"bash", '
        '"env_vars"?: {}, "timeout"?: seconds}: a context keeps its state between calls; '
        "at the timeout the cell is interrupted (KeyboardInterrupt) and the context kept.",
        "application/json",
        model=CodeRequest,
    ),
)
async def execute_code(sandbox_id: SandboxId, caller: Caller, request: Request) -> Response:
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
    answer = await _forward(daemon, request, "POST", "/execute", content=body)
    if answer.status_code == 200:  # JSON lines, one message each: not one JSON document
        answer.headers["content-type"] = "application/x-ndjson"
    return answer


@router.get(
    "/{sandbox_id}/code/contexts",
    responses=_LIVE_ERRORS,
    summary="List code contexts: [{id, language, cwd}]",
)
async def list_contexts(sandbox_id: SandboxId, caller: Caller, request: Request) -> Response:
    daemon = await _service(request).daemon(caller.tenant, sandbox_id)
    return await _forward(daemon, request, "GET", "/contexts")


@router.post(
    "/{sandbox_id}/code/contexts",
    responses=_LIVE_ERRORS,
    summary="Create a code context: {language?: python|bash, cwd?} -> {id, language, cwd}",
    openapi_extra=_body("The context to create.", "application/json", model=ContextRequest),
)
async def create_context(sandbox_id: SandboxId, caller: Caller, request: Request) -> Response:
    sandboxes = _service(request)
    daemon = await sandboxes.daemon(caller.tenant, sandbox_id)
    sandboxes.record(caller.tenant, caller.key_id, "sandbox.create_context", sandbox_id)
    return await _forward(daemon, request, "POST", "/contexts")


@router.api_route(
    "/{sandbox_id}/code/contexts/{context_id}",
    methods=["DELETE"],
    responses={**_LIVE_ERRORS, 204: {"description": "Removed"}},
    summary="Remove a code context (its interpreter and state)",
)
async def remove_context(
    sandbox_id: SandboxId,
    context_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")],
    caller: Caller,
    request: Request,
) -> Response:
    sandboxes = _service(request)
    daemon = await sandboxes.daemon(caller.tenant, sandbox_id)
    sandboxes.record(
        caller.tenant, caller.key_id, "sandbox.remove_context", sandbox_id,
        details={"context_id": context_id},
    )  # fmt: skip
    return await _forward(daemon, request, "DELETE", f"/contexts/{context_id}")


@router.post(
    "/{sandbox_id}/code/contexts/{context_id}/restart",
    responses={**_LIVE_ERRORS, 204: {"description": "Restarted"}},
    summary="Restart a code context: a fresh interpreter, its state dropped",
)
async def restart_context(
    sandbox_id: SandboxId,
    context_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")],
    caller: Caller,
    request: Request,
) -> Response:
    sandboxes = _service(request)
    daemon = await sandboxes.daemon(caller.tenant, sandbox_id)
    sandboxes.record(
        caller.tenant, caller.key_id, "sandbox.restart_context", sandbox_id,
        details={"context_id": context_id},
    )  # fmt: skip
    return await _forward(daemon, request, "POST", f"/contexts/{context_id}/restart", content=b"")


def _pair(item: str) -> tuple[str, str]:
    key, _, value = item.partition("=")  # the query's pattern ensures the '='
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
) -> Response:
    """Pass the request's body (or ``content``, when it was read already) to the daemon and
    its answer back, both streamed; a refusal in the native API's shape (``sandbox_error``).
    """
    upstream = await _send(daemon, request, method, path, params, content)
    if upstream.status_code not in _PASSED_STATUSES:
        return await _refusal(upstream)
    return _streamed(upstream, method, path)


async def _forward_as_is(
    daemon: DaemonClient,
    request: Request,
    method: str,
    path: str,
    params: dict[str, str] | None = None,
    content: bytes | None = None,
) -> StreamingResponse:
    """``_forward`` for E2B's door: the daemon speaks envd's protocol, refusals included."""
    upstream = await _send(daemon, request, method, path, params, content)
    return _streamed(upstream, method, path)


async def _send(
    daemon: DaemonClient,
    request: Request,
    method: str,
    path: str,
    params: dict[str, str] | None,
    content: bytes | None,
) -> DaemonResponse:
    body: AsyncIterable[bytes] | bytes | None = content
    if body is None and method not in ("GET", "DELETE"):
        body = request.stream()
    return await daemon.send(method, path, params=params, headers=request.headers, content=body)


def _streamed(upstream: DaemonResponse, method: str, path: str) -> StreamingResponse:
    download = method == "GET" and path == "/files" and upstream.status_code == 200
    return StreamingResponse(
        _relay(upstream),
        status_code=upstream.status_code,
        headers=answer_headers(upstream.headers, upstream.content_length, download=download),
        background=BackgroundTask(upstream.aclose),
    )


# What the native API passes on of the daemon's statuses; anything else is a refusal.
_PASSED_STATUSES = frozenset({200, 204})
_REFUSAL_BYTES = 64 * 1024  # of a refusal's body read (a longer one is not the daemon's)
# The daemon's error codes (Connect's) as the native API answers them. The daemon runs as
# the sandbox's user, so it picks among these only: never a status or code of the server's
# own (a key, a tenant, a replica), and nothing undocumented.
_SANDBOX_CODES: dict[str, tuple[int, str]] = {
    "not_found": (404, NotFound.code),
    "resource_exhausted": (429, "resource_exhausted"),  # 507 when it says so: a full disk
    **dict.fromkeys(
        ("invalid_argument", "failed_precondition", "out_of_range", "already_exists",
         "permission_denied", "unimplemented", "unauthenticated"),
        (400, InvalidRequest.code),
    ),
}  # fmt: skip
# envd's /files answers carry their HTTP status as the code.
_FILE_CODES = {
    400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
    404: "not_found", 409: "already_exists", 415: "invalid_argument", 507: "resource_exhausted",
}  # fmt: skip


def sandbox_error(status: int, body: bytes) -> tuple[int, str, str]:
    """The status, code and message the native API answers for a daemon's refusal (its
    ``status`` and ``body``: a Connect error ``{"code": "not_found", "message"}`` or envd's
    ``{"code": 404, "message"}``). What the daemon says that is not one of its known errors
    is a 502 ``sandbox_error``."""
    try:
        parsed = json.loads(body)
    except ValueError:  # UnicodeDecodeError too
        parsed = None
    code: object = parsed.get("code") if isinstance(parsed, dict) else None
    said = parsed.get("message") if isinstance(parsed, dict) else None
    message = _clip(said) if isinstance(said, str) else ""
    if isinstance(code, int) and not isinstance(code, bool):
        code = _FILE_CODES.get(code)
    known = _SANDBOX_CODES.get(code) if isinstance(code, str) and status >= 400 else None
    if known is None:
        detail = f": {message}" if message else ""
        return 502, SandboxError.code, f"the sandbox answered HTTP {status}{detail}"
    answered, ours = known
    if code == "resource_exhausted" and status == 507:
        answered = 507
    return answered, ours, message or f"the sandbox answered {code}"


async def _refusal(upstream: DaemonResponse) -> JSONResponse:
    body = bytearray()
    try:
        async for chunk in upstream.aiter_raw():
            body += chunk
            if len(body) > _REFUSAL_BYTES:
                break
    except SandboxNotRunning:
        pass  # what came is all there is
    finally:
        await upstream.aclose()
    status, code, message = sandbox_error(upstream.status_code, bytes(body))
    headers = {**_INERT, ORIGIN_HEADER: "sandbox"}
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers)


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
