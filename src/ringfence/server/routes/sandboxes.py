"""``/v1/sandboxes``: interactive sandboxes, their commands and their files.

Commands and the filesystem speak the sandbox daemon's own protocol (E2B envd's Connect RPC
with the JSON codec), passed through to the daemon after the caller's key and tenant are
checked: ``POST /v1/sandboxes/{id}/rpc/process.Process/Start`` is the daemon's
``POST /process.Process/Start``. Files move as raw bytes on ``/v1/sandboxes/{id}/files``.
Bodies stream both ways; nothing is buffered whole. The pass-through itself (tenant check,
audit, forwarding) is the service's (``service.sandbox_calls``); these routes find the
caller by its key and answer a daemon's refusal in the native error shape.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from ringfence.models import MAX_TIMEOUT_SECONDS, Env, Sandbox, SandboxSpec, SandboxState
from ringfence.sandboxd.methods import CLIENT_STREAMS, FILESYSTEM, METHODS, PROCESS
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody, shown
from ringfence.server.passthrough import Service, answered
from ringfence.server.routes.executions import BUDGET_ERRORS
from ringfence.service.keys import Principal
from ringfence.service.sandbox_calls import SandboxCaller, SandboxCalls
from ringfence.service.sandboxes import SandboxService

__all__ = ["STREAMED_PATHS", "router"]

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"])

# Bodies these routes pass through as they come (bounded by the sandbox's own limits).
_STREAMED_CALLS = "|".join("rpc/" + re.escape(name) for name in CLIENT_STREAMS)
STREAMED_PATHS = re.compile(rf"/v1/sandboxes/[^/]+/(files|{_STREAMED_CALLS})")

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
# `Ringfence-Origin: sandbox` (see ``service.sandbox_answers.sandbox_error``).
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
# Who the call acts as inside: the sandbox's unprivileged user (the default) or its root,
# which holds Docker's default capabilities in the sandbox's own user namespace only.
SandboxUser = Annotated[
    Literal["user", "root"] | None,  # sandboxd.methods.USERS
    Query(description="'user' (default: uid 1000, no capabilities) or 'root' (root inside "
          "the sandbox's own user namespace, never on the host)."),
]  # fmt: skip


class Timeout(BaseModel):
    timeout: float = Field(
        gt=0, le=MAX_TIMEOUT_SECONDS, description="Seconds from now until the sandbox is killed."
    )


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
    return deps.sandboxes(request)


def _calls(request: Request) -> SandboxCalls:
    return _service(request).calls


def _on(caller: Principal, sandbox_id: str) -> SandboxCaller:
    return SandboxCaller(caller.tenant, caller.key_id, sandbox_id)


def _methods(service: str) -> str:
    """The daemon's methods of ``service``, for the document: ``{Start, Connect, ...}``."""
    names = [name.partition("/")[2] for name in METHODS if name.startswith(service + "/")]
    return "{" + ", ".join(names) + "}"


@router.post(
    "",
    response_model=Sandbox,
    status_code=201,
    responses={
        **_ERRORS,
        **BUDGET_ERRORS,
        409: {
            "model": ErrorBody,
            "description": "auto_pause or on_timeout='pause' asked of a backend that cannot "
            "save the sandbox's files; the message says why (state_unsupported)",
        },
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
        f"(application/connect+json) for streams. Methods: {PROCESS}/{_methods(PROCESS)}, "
        f"{FILESYSTEM}/{_methods(FILESYSTEM)}. A terminal is a Start with "
        "`pty: {size: {rows, cols}}`: its output comes as `data.pty`, SendInput takes "
        "`input.pty`, Update `pty.size` resizes it.",
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
    user: SandboxUser = None,
) -> Response:
    name = f"{service.value}/{method}"
    calls = _calls(request)
    on = _on(caller, sandbox_id)
    return await answered(await calls.rpc(on, name, request.headers, request.stream(), user=user))


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
    user: SandboxUser = None,
) -> Response:
    calls = _calls(request)
    on = _on(caller, sandbox_id)
    return await answered(await calls.read_file(on, path, request.headers, user=user))


@router.get(
    "/{sandbox_id}/files/archive",
    responses={
        **_LIVE_ERRORS,
        200: {
            "description": "A tar stream (POSIX pax) of the directory's tree, names relative "
            "to it: directories, regular files, and symbolic links stored as links (never "
            "followed); fifos, sockets and devices are left out. Streamed as it is read; a "
            "stream cut short (the sandbox ended, or it passed the server's bound, "
            "RINGFENCE_ARCHIVE_MAX_BYTES: 4 times the sandbox's disk limit plus 4 GiB "
            "unless set) lacks the tar end marker.",
            "content": {"application/x-tar": {}},
        },
    },
    summary="Download a directory of the sandbox as a tar archive (streamed)",
)
async def read_archive(
    sandbox_id: SandboxId,
    caller: Caller,
    request: Request,
    path: Annotated[str, SandboxPath(description="A directory; relative to the home.")],
    user: SandboxUser = None,
) -> Response:
    calls = _calls(request)
    on = _on(caller, sandbox_id)
    response = await answered(await calls.read_archive(on, path, request.headers, user=user))
    if response.status_code == 200:  # the server asked for a tar: it names the type
        response.headers["content-type"] = "application/x-tar"
    return response


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
    user: SandboxUser = None,
) -> Response:
    on = _on(caller, sandbox_id)
    body = request.stream()
    written = await _calls(request).write_file(on, path, request.headers, body, user=user)
    return await answered(written)


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
    on = _on(caller, sandbox_id)
    answer = await _calls(request).run_code(on, request.headers, request.stream())
    if answer.status == 200:  # JSON lines, one message each: not one JSON document
        answer.headers["content-type"] = "application/x-ndjson"
    return await answered(answer)


@router.get(
    "/{sandbox_id}/code/contexts",
    responses=_LIVE_ERRORS,
    summary="List code contexts: [{id, language, cwd}]",
)
async def list_contexts(sandbox_id: SandboxId, caller: Caller, request: Request) -> Response:
    return await answered(
        await _calls(request).list_contexts(_on(caller, sandbox_id), request.headers)
    )


@router.post(
    "/{sandbox_id}/code/contexts",
    responses=_LIVE_ERRORS,
    summary="Create a code context: {language?: python|bash, cwd?} -> {id, language, cwd}",
    openapi_extra=_body("The context to create.", "application/json", model=ContextRequest),
)
async def create_context(sandbox_id: SandboxId, caller: Caller, request: Request) -> Response:
    on = _on(caller, sandbox_id)
    return await answered(
        await _calls(request).create_context(on, request.headers, request.stream())
    )


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
    on = _on(caller, sandbox_id)
    return await answered(await _calls(request).remove_context(on, context_id, request.headers))


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
    on = _on(caller, sandbox_id)
    return await answered(await _calls(request).restart_context(on, context_id, request.headers))


def _pair(item: str) -> tuple[str, str]:
    key, _, value = item.partition("=")  # the query's pattern ensures the '='
    return key, value
