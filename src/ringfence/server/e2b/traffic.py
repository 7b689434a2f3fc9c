"""Sandbox traffic: envd (port 49983) and the code interpreter (port 49999).

The SDKs send both to one ``E2B_SANDBOX_URL`` with ``E2b-Sandbox-Id`` and
``E2b-Sandbox-Port`` headers and no API key: what admits a request is the sandbox's access
token (``X-Access-Token``; for the code interpreter also ``E2B-Traffic-Access-Token``), which
names the tenant and key it was handed to. The sandbox daemon speaks both protocols
natively, so a request passes through the same service call as the native routes'
(``service.sandbox_calls``: tenant check, one-user rule, audit record) and its answer,
refusals included, goes back as envd's. Signed file URLs (``download_url``/``upload_url``)
are admitted by their signature instead, and find their sandbox by it.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response, StreamingResponse

from ringfence.errors import InvalidRequest, Unauthenticated
from ringfence.server.connections import authenticated
from ringfence.server.e2b.context import E2bContext, context_of
from ringfence.server.e2b.errors import error_response
from ringfence.server.e2b.streams import streamed_to_the_end
from ringfence.server.e2b.tokens import Grant, Purpose, expired
from ringfence.server.e2b.uploads import Failed, boundary_of, upload_parts
from ringfence.server.passthrough import Service, streamed
from ringfence.service.sandbox_answers import answer_headers
from ringfence.service.sandbox_calls import SandboxCaller, SandboxCalls

__all__ = ["CODE_PORT", "ENVD_PORT", "code_router", "envd_router"]

ENVD_PORT = "49983"
CODE_PORT = "49999"
# What a signed file URL carries (E2B's SDKs build it): all of it is signed or checked.
_SIGNED_PARAMETERS = frozenset({"path", "username", "signature", "signature_expiration"})
# A multipart upload's answer is the daemon's (its refusal, or the entries it wrote), marked
# as every passed-through answer is: no client takes it for the server's own.
_SANDBOX_ANSWER_HEADERS = answer_headers(
    [("content-type", "application/json")], None, download=False
)

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
    if not await context.keys.in_force(grant.key_id, grant.generation):
        raise Unauthenticated(
            "the API key this access token was handed to was revoked or rotated: "
            "connect to the sandbox again with the key in force"
        )
    return grant


def _user(request: Request) -> str | None:
    """The user the request asks to run as (``?username=``, or the name of a Basic
    ``Authorization``), or None; the service keeps the one-user rule.

    Raises:
        InvalidRequest: the Authorization header is malformed.
    """
    user = request.query_params.get("username") or None
    auth = request.headers.get("authorization", "")
    if auth[:6].lower() == "basic ":
        try:
            user = base64.b64decode(auth[6:].strip(), validate=True).decode().partition(":")[0]
        except (binascii.Error, UnicodeDecodeError):
            raise InvalidRequest("the Authorization header is malformed") from None
        user = user or None
    return user


def _calls(context: E2bContext) -> SandboxCalls:
    return context.sandboxes.calls


def _on(grant: Grant) -> SandboxCaller:
    return SandboxCaller(grant.tenant, grant.key_id, grant.sandbox_id)


@envd_router.get("/health")
@code_router.get("/health")
async def health(request: Request) -> Response:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    await _calls(context).reach(_on(grant))  # SandboxNotRunning → 502 "was not found"
    return Response(status_code=204)


@envd_router.post("/{service}/{method}")
async def call(
    service: Service,
    method: Annotated[str, Path(pattern=r"^[A-Za-z]{1,64}$")],
    request: Request,
) -> StreamingResponse:
    """envd's Connect RPC, as the native ``/v1/sandboxes/{id}/rpc/...`` route passes it."""
    context, grant = await _admit(request, Purpose.ENVD)
    name, user = f"{service.value}/{method}", _user(request)
    calls = _calls(context)
    answer = await calls.rpc(_on(grant), name, request.headers, request.stream(), user=user)
    return streamed_to_the_end(answer, grant.sandbox_id)


@envd_router.get("/files")
async def read_file(request: Request) -> Response:
    context, grant, _ = await _admit_file(request, "read")
    user, path = _user(request), request.query_params.get("path") or None
    # no path is refused after the one-user rule and the lookup, as it always was
    answer = await _calls(context).read_file(_on(grant), path, request.headers, user=user)
    return streamed(answer)


@envd_router.post("/files")
async def write_files(request: Request) -> Response:
    """One file as ``application/octet-stream`` (``?path=``) or several as multipart."""
    context, grant, signed = await _admit_file(request, "write")
    writer = await _calls(context).file_writer(_on(grant), user=_user(request))
    path = request.query_params.get("path") or None
    boundary = boundary_of(request.headers.get("content-type", ""))
    if boundary is None:
        if path is None:
            raise InvalidRequest("an upload that is not multipart needs ?path=")
        return streamed(await writer.write(path, request.headers, request.stream()))
    try:
        written = await upload_parts(writer, request, boundary, path, single=signed)
    except Failed as failed:
        headers = _SANDBOX_ANSWER_HEADERS if failed.from_sandbox else None
        return Response(failed.body, failed.status, headers, "application/json")
    return Response(json.dumps(written), 200, _SANDBOX_ANSWER_HEADERS, "application/json")


async def _admit_file(request: Request, operation: str) -> tuple[E2bContext, Grant, bool]:
    """A token, or a signed URL (which carries no sandbox id when every sandbox shares one
    ``E2B_SANDBOX_URL``: the signature finds it); and whether it was a signed URL.

    A signed URL admits exactly what it signed: one ``operation`` on one path as one user.
    So it carries its signed parameters once each and nothing else (a parameter the
    signature does not cover could only change what the request does); the route keeps to
    one file (``upload_parts(single=True)``).

    Raises:
        Unauthenticated: no valid token, or a signature that is not valid ("invalid
            signature") or, once valid, expired ("signature is already expired"), in
            envd's words and order.
        InvalidRequest: a signed URL with a parameter repeated or not signed, or an
            expiration that is not an integer (as envd's parameter parsing refuses it).
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
    if expiration is not None and not _is_integer(expiration):
        raise InvalidRequest(
            f"Invalid format for parameter signature_expiration: {expiration!r} is not an integer"
        )
    signed = context.grants.by_signature(
        _path(request), operation, request.query_params.get("username", ""), signature, expiration
    )
    named = request.headers.get("e2b-sandbox-id")
    if signed is None or (named and named != signed.sandbox_id):
        raise Unauthenticated("invalid signature")  # envd's words
    if expired(expiration):  # checked once the signature holds, as envd does
        raise Unauthenticated("signature is already expired")
    signed = await _in_force(context, signed)
    authenticated()  # its upload's body may take as long as it takes
    return context, signed, True


def _is_integer(raw: str) -> bool:
    digits = raw.removeprefix("-")
    return digits.isascii() and digits.isdigit()


def _path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise InvalidRequest("the path query parameter is required")
    return path


@code_router.post("/execute")
async def execute(request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    answer = await _calls(context).run_code(_on(grant), request.headers, request.stream())
    return streamed_to_the_end(answer, grant.sandbox_id)


@code_router.get("/contexts")
async def list_contexts(request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    return streamed(await _calls(context).list_contexts(_on(grant), request.headers))


@code_router.post("/contexts")
async def create_context(request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    calls = _calls(context)
    return streamed(await calls.create_context(_on(grant), request.headers, request.stream()))


@code_router.delete("/contexts/{context_id}")
async def remove_context(context_id: ContextId, request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    calls = _calls(context)
    return streamed(await calls.remove_context(_on(grant), context_id, request.headers))


@code_router.post("/contexts/{context_id}/restart")
async def restart_context(context_id: ContextId, request: Request) -> StreamingResponse:
    context, grant = await _admit(request, Purpose.ENVD, Purpose.TRAFFIC)
    calls = _calls(context)
    return streamed(await calls.restart_context(_on(grant), context_id, request.headers))


def unknown_port(port: str, path: str) -> Response:
    return error_response(
        404,
        f"port {port} is not served: Ringfence serves envd ({ENVD_PORT}) and the code "
        f"interpreter ({CODE_PORT})",
        path,
    )
