"""Errors in E2B's shapes, so that its SDKs raise their own exceptions for them.

The control plane and envd's plain HTTP answer ``{"code": <HTTP status>, "message"}``;
Connect RPC paths answer ``{"code": "<connect code>", "message"}``. A sandbox that has ended
is, on sandbox traffic, a 502 whose message says "was not found": the SDK's
``SandboxNotRunningException``.
"""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ringfence.errors import HTTP_STATUS, NotFound, RingfenceError, SandboxNotRunning
from ringfence.server import deps
from ringfence.server.errors import host_paths

__all__ = ["CONNECT_CODES", "Shape", "error_response", "install_error_handlers", "not_running"]

log = logging.getLogger(__name__)

# HTTP status → Connect code (what envd's RPC errors carry).
CONNECT_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "already_exists",
    413: "resource_exhausted",
    429: "resource_exhausted",
    501: "unimplemented",
    502: "unavailable",
    503: "unavailable",
}
Shape = Literal["control", "sandbox"]


def error_response(status: int, message: str, path: str = "") -> JSONResponse:
    """An E2B error: Connect-shaped on RPC paths (``/package.Service/Method``)."""
    code: int | str = status
    if path.startswith(("/process.", "/filesystem.")):
        code = CONNECT_CODES.get(status, "unknown")
    return JSONResponse({"code": code, "message": message}, status_code=status)


def not_running(sandbox_id: str, path: str) -> JSONResponse:
    return error_response(502, f"The sandbox {sandbox_id} was not found", path)


def install_error_handlers(app: FastAPI, shape: Shape) -> None:
    async def ringfence_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RingfenceError)
        if isinstance(exc, SandboxNotRunning | NotFound) and shape == "sandbox":
            return not_running(request.headers.get("e2b-sandbox-id", ""), request.url.path)
        status = HTTP_STATUS.get(exc.code, 500)
        if isinstance(exc, SandboxNotRunning):
            status = 404  # E2B's control plane sees only running sandboxes
        context = deps.e2b_if_any(request)
        paths = host_paths(context.sandboxes.config if context is not None else None)
        return error_response(status, paths.redact(exc.message), request.url.path)

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
            problems.append(f"{where}: {error.get('msg', 'invalid')}")
        return error_response(400, "; ".join(problems), request.url.path)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return error_response(exc.status_code, str(exc.detail), request.url.path)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving E2B %s %s", request.method, request.url.path)
        return error_response(500, "an unexpected error occurred; it was logged", request.url.path)

    app.add_exception_handler(RingfenceError, ringfence_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
