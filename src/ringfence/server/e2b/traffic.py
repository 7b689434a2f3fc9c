"""Sandbox traffic: envd (port 49983) and the code interpreter (port 49999).

The SDKs send both to one ``E2B_SANDBOX_URL`` with ``E2b-Sandbox-Id`` and
``E2b-Sandbox-Port`` headers and no API key: what admits a request is the sandbox's access
token (``X-Access-Token``; for the code interpreter also ``E2B-Traffic-Access-Token``), which
names the tenant and key it was handed to. The sandbox daemon speaks both protocols
natively, so a request passes through with the same tenant check and audit record as the
native routes'. Signed file URLs (``download_url``/``upload_url``) are admitted by their
signature instead, and find their sandbox by it.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response, StreamingResponse

from ringfence.errors import Forbidden, InvalidRequest, Unauthenticated
from ringfence.server.connections import authenticated
from ringfence.server.e2b.context import E2bContext, context_of
from ringfence.server.e2b.errors import error_response
from ringfence.server.e2b.tokens import Grant, Purpose, expired
from ringfence.server.e2b.uploads import Failed, boundary_of, upload_parts
from ringfence.server.routes.sandboxes import (
    _CHANGING,
    Service,
    _audited,
    _clip,
    _forward_as_is,
    _message,
    answer_headers,
)
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.keys import in_force

__all__ = ["CODE_PORT", "ENVD_PORT", "code_router", "envd_router"]

ENVD_PORT = "49983"
CODE_PORT = "49999"
_SANDBOX_USER = "user"  # the one user inside a sandbox
# What a signed file URL carries (E2B's SDKs build it): all of it is signed or checked.
_SIGNED_PARAMETERS = frozenset({"path", "username", "signature", "signature_expiration"})
# A multipart upload's answer is the daemon's (its refusal, or the entries it wrote), marked
# as every passed-through answer is: no client takes it for the server's own.
_SANDBOXS_WORD = answer_headers([("content-type", "application/json")], None, download=False)

envd_router = APIRouter()
code_router = APIRouter()

ContextId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


async def _admit(request: Request, *purposes: Purpose) -> tuple[E2bContext, Grant]:
    """The grant of the request's token for the sandbox it names.

    Raises:
        Unauthenticated: no sandbox id, or no token minted for that sandbox.
    """
    context = context_of(request)
    sandbox_id = request.headers.get("e2b-sandbox-id")
    if not sandbox_id:
        raise Unauthenticated("the E2b-Sandbox-Id header is required")
    headers = {Purpose.ENVD: "x-access-token", Purpose.TRAFFIC: "e2b-traffic-access-token"}
    for purpose in purposes:
        grant = context.grants.check(request.headers.get(headers[purpose]), sandbox_id, purpose)
        if grant is not None:
            grant = await _in_force(context, grant)
            authenticated()  # its connection may idle as long as keep-alive allows
            return context, grant
    raise Unauthenticated(f"a valid access token for sandbox {sandbox_id} is required")


async def _in_force(context: E2bContext, grant: Grant) -> Grant:
    """``grant``, if the key it was handed to is not revoked or rotated since.

    Raises:
        Unauthenticated: that key was revoked or rotated.
    """
    if not await in_force(context.store, grant.key_id, grant.generation, context.keys):
        raise Unauthenticated(
            "the API key this access token was handed to was revoked or rotated: "
            "connect to the sandbox again with the key in force"
        )
    return grant


def _check_user(request: Request) -> None:
    """Everything in a sandbox runs as its one unprivileged user: asking for another (say
    ``root``) is refused rather than silently run as ``user``."""
    user = request.query_params.get("username") or None
    auth = request.headers.get("authorization", "")
    if auth[:6].lower() == "basic ":
        try:
            user = base64.b64decode(auth[6:].strip(), validate=True).decode().partition(":")[0]
        except (binascii.Error, UnicodeDecodeError):
            raise InvalidRequest("the Authorization header is malformed") from None
        user = user or None
    if user is not None and user != _SANDBOX_USER:
        raise Forbidden(
            f"user {user!r} is not available: a sandbox runs everything as its one "
            f"unprivileged user {_SANDBOX_USER!r}"
        )


async def _daemon(context: E2bContext, grant: Grant) -> DaemonClient:
    return await context.sandboxes.daemon(grant.tenant, grant.sandbox_id)


@envd_router.get("/health")
@code_router.get("/health")
async def health(request: Request) -> Response:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    await _daemon(context, grant)  # SandboxNotRunning → 502 "was not found"
    return Response(status_code=204)


@envd_router.post("/{service}/{method}")
async def call(
    service: Service,
    method: Annotated[str, Path(pattern=r"^[A-Za-z]{1,64}$")],
    request: Request,
) -> StreamingResponse:
    """envd's Connect RPC, as the native ``/v1/sandboxes/{id}/rpc/...`` route passes it."""
    context, grant = await _admit(request, Purpose.ENVD)
    _check_user(request)
    daemon = await _daemon(context, grant)
    target = f"/{service.value}/{method}"
    if method not in _CHANGING[service]:
        return await _forward_as_is(daemon, request, "POST", target)
    record = context.sandboxes.record
    if (service, method) == (Service.PROCESS, "StreamInput"):
        record(grant.tenant, grant.key_id, f"sandbox.{method}", grant.sandbox_id)
        return await _forward_as_is(daemon, request, "POST", target)
    body = await request.body()  # bounded by the layer's body limit
    details = _audited(method, body)
    record(grant.tenant, grant.key_id, f"sandbox.{method}", grant.sandbox_id, details=details)
    return await _forward_as_is(daemon, request, "POST", target, content=body)


@envd_router.get("/files")
async def read_file(request: Request) -> Response:
    context, grant, _ = await _admit_file(request, "read")
    _check_user(request)
    daemon = await _daemon(context, grant)
    return await _forward_as_is(daemon, request, "GET", "/files", {"path": _path(request)})


@envd_router.post("/files")
async def write_files(request: Request) -> Response:
    """One file as ``application/octet-stream`` (``?path=``) or several as multipart."""
    context, grant, signed = await _admit_file(request, "write")
    _check_user(request)
    daemon = await _daemon(context, grant)
    path = request.query_params.get("path") or None

    def on_file(target: str) -> None:
        context.sandboxes.record(
            grant.tenant, grant.key_id, "sandbox.write_file", grant.sandbox_id,
            details={"path": _clip(target)},
        )  # fmt: skip

    boundary = boundary_of(request.headers.get("content-type", ""))
    if boundary is None:
        if path is None:
            raise InvalidRequest("an upload that is not multipart needs ?path=")
        on_file(path)
        return await _forward_as_is(daemon, request, "POST", "/files", {"path": path})
    try:
        written = await upload_parts(daemon, request, boundary, path, on_file, single=signed)
    except Failed as failed:
        headers = _SANDBOXS_WORD if failed.from_sandbox else None
        return Response(failed.body, failed.status, headers, "application/json")
    return Response(json.dumps(written), 200, _SANDBOXS_WORD, "application/json")


async def _admit_file(request: Request, operation: str) -> tuple[E2bContext, Grant, bool]:
    """A token, or a signed URL (which carries no sandbox id when every sandbox shares one
    ``E2B_SANDBOX_URL``: the signature finds it); and whether it was a signed URL.

    A signed URL admits exactly what it signed: one ``operation`` on one path as one user.
    So it carries its signed parameters once each and nothing else (a parameter the
    signature does not cover could only change what the request does); the route keeps to
    one file (``upload_parts(single=True)``).

    Raises:
        Unauthenticated: no valid token, or a signature that is not valid (or has expired).
        InvalidRequest: a signed URL with a parameter repeated or not signed.
    """
    signature = request.query_params.get("signature")
    if signature is None:
        context, grant = await _admit(request, Purpose.ENVD)
        return context, grant, False
    context = context_of(request)
    names = [name for name, _ in request.query_params.multi_items()]
    for name in dict.fromkeys(names):
        if name not in _SIGNED_PARAMETERS:
            raise InvalidRequest(f"a signed URL carries no other parameter: ?{name}= is not signed")
        if names.count(name) > 1:
            raise InvalidRequest(f"a signed URL carries ?{name}= once")
    expiration = request.query_params.get("signature_expiration") or None
    if expired(expiration):
        raise Unauthenticated("the signed URL has expired")
    signed = context.grants.by_signature(
        _path(request), operation, request.query_params.get("username", ""), signature, expiration
    )
    named = request.headers.get("e2b-sandbox-id")
    if signed is None or (named and named != signed.sandbox_id):
        raise Unauthenticated(f"the URL's signature is not valid for a {operation}")
    signed = await _in_force(context, signed)
    authenticated()  # its upload's body may take as long as it takes
    return context, signed, True


def _path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise InvalidRequest("the path query parameter is required")
    return path


@code_router.post("/execute")
async def execute(request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    daemon = await _daemon(context, grant)
    body = await request.body()
    message = _message(body)
    details = {
        "code": _clip(str(message.get("code", ""))),
        "context_id": message.get("context_id"),
        "language": message.get("language"),
    }
    context.sandboxes.record(
        grant.tenant, grant.key_id, "sandbox.run_code", grant.sandbox_id, details=details
    )
    return await _forward_as_is(daemon, request, "POST", "/execute", content=body)


@code_router.get("/contexts")
async def list_contexts(request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    return await _forward_as_is(await _daemon(context, grant), request, "GET", "/contexts")


@code_router.post("/contexts")
async def create_context(request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    daemon = await _daemon(context, grant)
    context.sandboxes.record(grant.tenant, grant.key_id, "sandbox.create_context", grant.sandbox_id)
    return await _forward_as_is(daemon, request, "POST", "/contexts")


@code_router.delete("/contexts/{context_id}")
async def remove_context(context_id: ContextId, request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    daemon = await _daemon(context, grant)
    context.sandboxes.record(
        grant.tenant, grant.key_id, "sandbox.remove_context", grant.sandbox_id,
        details={"context_id": context_id},
    )  # fmt: skip
    return await _forward_as_is(daemon, request, "DELETE", f"/contexts/{context_id}")


@code_router.post("/contexts/{context_id}/restart")
async def restart_context(context_id: ContextId, request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    daemon = await _daemon(context, grant)
    context.sandboxes.record(
        grant.tenant, grant.key_id, "sandbox.restart_context", grant.sandbox_id,
        details={"context_id": context_id},
    )  # fmt: skip
    return await _forward_as_is(
        daemon, request, "POST", f"/contexts/{context_id}/restart", content=b""
    )


def unknown_port(port: str, path: str) -> Response:
    return error_response(
        404,
        f"port {port} is not served: Ringfence serves envd ({ENVD_PORT}) and the code "
        f"interpreter ({CODE_PORT})",
        path,
    )
