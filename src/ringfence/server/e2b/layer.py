"""The door E2B's SDKs knock on: one ASGI layer in front of the native app.

With ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` both set to this server, the SDKs send:

- control-plane calls (``/sandboxes``, ``/v2/sandboxes``...) with ``X-API-KEY`` and no
  ``E2b-Sandbox-Port`` header;
- envd calls with ``E2b-Sandbox-Port: 49983`` and the code interpreter's with ``49999``,
  both with ``E2b-Sandbox-Id``;
- signed file URLs (``/files?...&signature=``) with no E2B header at all;
- and, with ``E2B_VOLUME_API_URL`` set to this server too, volume content calls
  (``/volumecontent/...``) with a volume's token (``server.e2b.volumes``).

The layer routes each to its own small app (E2B's error shapes, its own body limit, no
OpenAPI: docs/e2b.md describes it); everything else goes on to the native app untouched.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from ringfence.sandboxd.methods import CLIENT_STREAMS
from ringfence.server import deps
from ringfence.server.e2b.context import E2bContext
from ringfence.server.e2b.control import router as control_router
from ringfence.server.e2b.errors import Shape, install_error_handlers
from ringfence.server.e2b.tokens import Grants
from ringfence.server.e2b.traffic import (
    CODE_PORT,
    ENVD_PORT,
    code_router,
    envd_router,
    unknown_port,
)
from ringfence.server.e2b.volumes import CONTENT_STREAMED, content_router
from ringfence.server.limits import BodyLimit
from ringfence.service.keys import Keys
from ringfence.service.sandboxes import SandboxService

__all__ = ["E2bLayer"]

_CONTROL_PATHS = re.compile(r"/((v2/)?sandboxes|snapshots|(v\d+/)?templates|volumes)(/.*)?")
# Bodies streamed to the sandbox as they come (its disk and the daemon bound them).
_STREAMED = re.compile("|".join(["/files", *("/" + re.escape(n) for n in CLIENT_STREAMS)]))


class E2bLayer:
    """ASGI middleware: E2B's traffic to the E2B apps, the rest to ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Keys,
        sandboxes: SandboxService,
        max_request_bytes: int,
        grants: Grants | None = None,
    ) -> None:
        self.app = app
        context = E2bContext(keys, sandboxes, grants if grants is not None else Grants())
        self.control = BodyLimit(_app(context, "control", control_router), max_request_bytes)
        self.envd = BodyLimit(_app(context, "sandbox", envd_router), max_request_bytes, _STREAMED)
        self.code = BodyLimit(_app(context, "sandbox", code_router), max_request_bytes)
        self.volume_content = BodyLimit(
            _app(context, "control", content_router), max_request_bytes,
            re.compile(CONTENT_STREAMED),
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        port = _header(scope, b"e2b-sandbox-port")
        path: str = scope["path"]
        if port == ENVD_PORT:
            await self.envd(scope, receive, send)
        elif port == CODE_PORT:
            await self.code(scope, receive, send)
        elif port is not None:
            await unknown_port(port, path)(scope, receive, send)
        elif _CONTROL_PATHS.fullmatch(path):
            await self.control(scope, receive, send)
        elif path.startswith("/volumecontent/"):
            await self.volume_content(scope, receive, send)
        elif path == "/files" and b"signature=" in scope.get("query_string", b""):
            await self.envd(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _app(context: E2bContext, shape: Shape, router: APIRouter) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    deps.attach_e2b(app, context)
    install_error_handlers(app, shape)
    app.include_router(router)
    return app


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None
