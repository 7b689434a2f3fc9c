"""The ASGI application: routes over the service layer, JSON errors, OpenAPI."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from ringfence import __version__
from ringfence.audit.chain import SYSTEM
from ringfence.config import Config
from ringfence.mcp.http import McpEndpoint
from ringfence.server import deps
from ringfence.server.console import router as console_router
from ringfence.server.e2b import E2bLayer
from ringfence.server.e2b.tokens import Grants
from ringfence.server.errors import install_error_handlers
from ringfence.server.limits import BodyBeforeRefusal, BodyLimit
from ringfence.server.openapi import with_server_bounds
from ringfence.server.port_relay import WebSocketSlots
from ringfence.server.routes import audit as audit_routes
from ringfence.server.routes import browser as browser_routes
from ringfence.server.routes import browser_cdp, meta
from ringfence.server.routes import executions as execution_routes
from ringfence.server.routes import keys as key_routes
from ringfence.server.routes import network as network_routes
from ringfence.server.routes import ports as port_routes
from ringfence.server.routes import proposals as proposal_routes
from ringfence.server.routes import sandbox_metrics as metrics_routes
from ringfence.server.routes import sandbox_projects as project_routes
from ringfence.server.routes import sandbox_state as state_routes
from ringfence.server.routes import sandboxes as sandbox_routes
from ringfence.server.routes import volumes as volume_routes

if TYPE_CHECKING:
    from ringfence.compose import Services

__all__ = ["create_app"]

DESCRIPTION = """\
Ringfence runs untrusted, agent-written code in isolated, resource-bounded sandboxes.

Authenticate with a Ringfence API key: `Authorization: Bearer <key>` (or `X-API-Key`).
Every object belongs to the key's tenant; another tenant's objects answer 404.
Errors are JSON: `{"error": {"code": "...", "message": "..."}}`.
"""


def create_app(services: Services) -> FastAPI:
    """The application over ``services`` (``ringfence.compose.build_services``).

    At start-up it reconciles (executions a previous process left unfinished, and sandboxes
    it ran, are marked failed); at shutdown it kills sandboxes, cancels running executions,
    stores how each ended, and closes the executor and the audit log. The store stays open:
    ``services.aclose`` closes it, after the app has stopped.
    """
    audit, executions, sandboxes = services.audit, services.executions, services.sandboxes
    approvals, keys = services.approvals, services.keys
    max_request_bytes = services.config.max_request_bytes

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        audit.start()
        audit.record("", SYSTEM, "server.start", "server", details={"version": __version__})
        await executions.reconcile()
        await sandboxes.reconcile()
        await approvals.reconcile()
        approvals.start()
        sandboxes.start()
        try:
            async with mcp.running():
                yield
        finally:
            await approvals.aclose()
            await services.browser.settled()  # one-shot sandboxes' kills under way, first
            await sandboxes.aclose()
            # Here, not only in services.aclose: uvicorn re-raises SIGTERM once the app
            # has stopped, so 'ringfence serve' never gets that far on a signal.
            await services.volumes.unmount_all()
            await executions.aclose()
            audit.record("", SYSTEM, "server.stop", "server")
            await audit.aclose()  # after everything else: their last records, then a seal

    app = FastAPI(
        title="Ringfence", version=__version__, description=DESCRIPTION, lifespan=lifespan
    )
    deps.attach(app, services)
    install_error_handlers(app)
    _state_bounds(app, services.config)
    streamed = re.compile(
        f"{sandbox_routes.STREAMED_PATHS.pattern}|{volume_routes.STREAMED_PATHS.pattern}"
    )
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes, streamed=streamed)
    grants = Grants()  # E2B's access tokens: its door mints them, preview URLs take them
    app.add_middleware(  # E2B's SDKs' traffic never reaches the native routes
        E2bLayer, keys=keys, sandboxes=sandboxes,
        max_request_bytes=max_request_bytes, grants=grants,
    )  # fmt: skip
    # Outside both: a refusal of either waits for the body the client is still sending.
    app.add_middleware(BodyBeforeRefusal, max_bytes=max_request_bytes)
    config = services.config
    websockets = WebSocketSlots(config.max_relayed_websockets, config.max_websocket_message_bytes)
    # In front of the API, behind the preview routes: the sandbox browser's CDP WebSocket.
    app.add_middleware(
        browser_cdp.CdpLayer, ports=sandboxes.ports, keys=keys, grants=grants,
        browser=services.browser, websockets=websockets,
        max_message=config.max_browser_result_bytes,
        sessions=browser_cdp.CdpSessions(
            config.max_cdp_sessions_per_tenant, config.max_cdp_sessions_per_sandbox
        ),
    )  # fmt: skip
    # Outermost: a preview URL's request streams to its sandbox, unbounded by the API's
    # body limit, and nothing under the preview domain reaches the API (docs/ports.md).
    app.add_middleware(
        port_routes.PortLayer, ports=sandboxes.ports, keys=keys, grants=grants,
        domain=config.ports_domain, max_websocket_message=config.max_websocket_message_bytes,
        websockets=websockets,
    )  # fmt: skip
    app.include_router(meta.router)
    app.include_router(execution_routes.router)
    app.include_router(sandbox_routes.router)
    app.include_router(metrics_routes.router)
    app.include_router(state_routes.router)
    app.include_router(state_routes.snapshots)
    app.include_router(browser_routes.router)
    app.include_router(browser_routes.one_shot)
    app.include_router(volume_routes.router)
    app.include_router(project_routes.router)
    app.include_router(network_routes.router)
    app.include_router(proposal_routes.router)
    app.include_router(audit_routes.router)
    app.include_router(key_routes.router)
    app.include_router(console_router)
    mcp = McpEndpoint(app, keys)  # MCP over streamable HTTP: docs/mcp.md
    app.router.routes.append(mcp.route())
    return app


def _state_bounds(app: FastAPI, config: Config) -> None:
    """Serve an OpenAPI document that states this server's ceilings (built once, kept)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = browser_cdp.documented(port_routes.documented(build()))
            app.openapi_schema = with_server_bounds(document, config)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
