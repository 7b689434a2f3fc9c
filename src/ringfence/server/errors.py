"""Every error leaves the server as JSON ``{"error": {"code": ..., "message": ...}}``.

Codes are stable API (see ``ringfence.errors``); statuses come from one table. Bad input is a
4xx naming the problem, never a 500 with a traceback. The OpenAPI document lists, on every
operation, the statuses any of them may answer (``_ANY_OPERATION``) beside each route's own,
and not FastAPI's 422: a request that fails validation is a 400 here. A message names none
of the server's host directories (``HostPaths``): a tenant reads ``<templates>/x``, the
operator's log the whole path.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from ringfence.audit.redact import loggable
from ringfence.config import Config
from ringfence.errors import HTTP_STATUS, RingfenceError
from ringfence.models import ExecutionResult, Sandbox
from ringfence.server import deps
from ringfence.templates import templates_dir

__all__ = ["ErrorBody", "HostPaths", "install_error_handlers", "shown"]

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable, machine-readable: e.g. invalid_request, not_found.")
    message: str = Field(description="What went wrong, in plain words.")


class ErrorBody(BaseModel):
    error: ErrorDetail


@dataclass(frozen=True)
class HostPaths:
    """The server's own directories, as a tenant may read them: by role, never by where they
    are on the host (the templates directory, the data and runtime directories, the cgroup
    tree). Messages about templates, root filesystems, sockets or cgroups are written for
    the operator; every answer to a tenant goes through ``redact``."""

    roots: tuple[tuple[re.Pattern[str], str], ...]  # longest path first

    @classmethod
    def of(cls, config: Config) -> HostPaths:
        named = {
            "templates": templates_dir(config),
            "data": config.data_dir,
            "runtime": config.runtime_dir,
            "cgroups": Path("/sys/fs/cgroup"),
        }
        forms = {
            str(form): f"<{name}>"
            for name, path in named.items()
            for form in (path, path.resolve())
            if len(form.parts) > 1
        }
        ordered = sorted(forms.items(), key=lambda item: -len(item[0]))
        # A root ends where its name does: "/srv/t" is not in "/srv/t-old".
        end = r"(?![^/\s'\"`:;,)\]}])"
        return cls(tuple((re.compile(re.escape(path) + end), name) for path, name in ordered))

    def redact(self, text: str) -> str:
        for pattern, name in self.roots:
            text = pattern.sub(name, text)
        return text


def host_paths(config: Config | None) -> HostPaths:
    """The ``HostPaths`` of an app's settings (the defaults when it has none)."""
    return HostPaths.of(config or Config())


def _host_paths_of(request: Request) -> HostPaths:
    return host_paths(deps.settings_if_any(request))


_Ended = TypeVar("_Ended", Sandbox, ExecutionResult)


def shown(request: Request, value: _Ended) -> _Ended:
    """``value`` as a tenant reads it: its ``error`` (why a sandbox or an execution failed,
    in the backend's words) names no host directory."""
    if not value.error:
        return value
    return value.model_copy(update={"error": _host_paths_of(request).redact(value.error)})


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


def _error(description: str) -> dict[str, Any]:
    schema = {"$ref": "#/components/schemas/ErrorBody"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# Statuses any operation may answer, whatever it does.
_ANY_OPERATION = {
    "413": _error(
        "The request body is larger than the server's limit (too_large); file uploads stream "
        "and only the sandbox's disk bounds them"
    ),
    "500": _error("An unexpected error, logged by the server (internal)"),
}
# And any operation that reads a key (the store is asked, or its cache).
_AUTHENTICATED = {
    "401": _error("Missing or invalid API key (unauthenticated)"),
    "503": _error(
        "The store or the backend is unavailable (store_error, backend_unavailable), or the "
        "server has granted all its host has (server_at_capacity)"
    ),
}


def _documented(build: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """``build`` (an app's ``openapi``) with the statuses of every operation added."""

    def openapi() -> dict[str, Any]:
        document = build()
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                responses: dict[str, Any] = operation.setdefault("responses", {})
                responses.pop("422", None)
                shared = {**_ANY_OPERATION, **(_AUTHENTICATED if "security" in operation else {})}
                for status, response in shared.items():
                    responses.setdefault(status, response)
        schemas = document.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        return document

    return openapi


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error as ``ErrorBody``, and document the statuses that any operation
    may answer."""
    app.openapi = _documented(app.openapi)  # type: ignore[method-assign]

    async def ringfence_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RingfenceError)
        status = HTTP_STATUS.get(exc.code, 500)
        if status >= 500:
            # The message may hold a sandbox's words (its browser agent's): escaped and
            # clipped, its URLs' secrets removed, so it can neither forge lines nor leak.
            log.warning("%s %s: %s", request.method, request.url.path, loggable(exc.message))
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        message = _host_paths_of(request).redact(exc.message)
        response = _body(status, exc.code, message)
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
