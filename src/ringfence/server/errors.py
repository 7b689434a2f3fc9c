"""Every error leaves the server as JSON ``{"error": {"code": ..., "message": ...}}``.

Codes are stable API (see ``ringfence.errors``); statuses come from one table. Bad input is a
4xx naming the problem, never a 500 with a traceback.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from ringfence.errors import HTTP_STATUS, RingfenceError

__all__ = ["ErrorBody", "install_error_handlers"]

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable, machine-readable: e.g. invalid_request, not_found.")
    message: str = Field(description="What went wrong, in plain words.")


class ErrorBody(BaseModel):
    error: ErrorDetail


def _body(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


_HTTP_CODES = {
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}


def install_error_handlers(app: FastAPI) -> None:
    async def ringfence_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RingfenceError)
        status = HTTP_STATUS.get(exc.code, 500)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        response = _body(status, exc.code, exc.message)
        if headers:
            response.headers.update(headers)
        return response

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
            problems.append(f"{where}: {error.get('msg', 'invalid')}")
        return _body(400, "invalid_request", "; ".join(problems))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        return _body(exc.status_code, code, str(exc.detail))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return _body(500, "internal", "an unexpected error occurred; it was logged")

    app.add_exception_handler(RingfenceError, ringfence_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
