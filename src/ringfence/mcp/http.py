"""MCP over streamable HTTP inside ``ringfence serve``, at ``/mcp``.

Every request must carry a Ringfence API key (``Authorization: Bearer`` or ``X-API-Key``,
as the HTTP API): it is checked here, before the MCP layer sees the request, and refused
with the HTTP API's own 401 answer. A tool call then runs the SDK against the same
application in this process with that request's key (``CallerConnector``), so each caller
sees and changes only their own tenant's objects, and the audit log names their key: exactly
as if they had called the HTTP API themselves. No key is ever kept between requests.

The transport is stateless (a fresh MCP transport per request, no session to hijack or to
lose when several replicas serve behind a load balancer): the tools need no state between
calls, since every answer carries the ids the next call needs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ringfence.errors import HTTP_STATUS, RingfenceError
from ringfence.mcp._connect import CallerConnector
from ringfence.mcp.server import build_server
from ringfence.server.connections import authenticated
from ringfence.service.keys import Keys

__all__ = ["MCP_PATH", "McpEndpoint"]

MCP_PATH = "/mcp"


class McpEndpoint:
    """The ASGI endpoint; ``running()`` must be entered for as long as the app serves.

    ``app`` is the whole application (tool calls go to its HTTP API); ``keys`` is what its
    own authentication uses (the HTTP API's: one cache, one answer).
    """

    def __init__(self, app: ASGIApp, keys: Keys) -> None:
        self._keys = keys
        server = build_server(CallerConnector(app))
        # Makes the server's session manager (the Starlette app around it is not used).
        # DNS-rebinding checks guard servers that trust ambient credentials; this endpoint
        # trusts only a key in a header, which a rebound page cannot send.
        server.streamable_http_app(
            stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._manager = server.session_manager
        self._serve = AuthContextMiddleware(self._manager.handle_request)

    def route(self) -> Route:
        """Its route, at ``MCP_PATH``, for every method (POST, GET, DELETE)."""
        return Route(MCP_PATH, self, include_in_schema=False)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve while inside. The session manager's task group lives in a task of its own,
        so this may be left from another task than the one that entered it (as test
        harnesses do with an app's lifespan)."""
        ready, done = asyncio.Event(), asyncio.Event()

        async def run() -> None:
            async with self._manager.run():
                ready.set()
                await done.wait()

        task = asyncio.create_task(run())
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.is_set():
            waiting.cancel()
            await task  # raises what stopped it
            raise RuntimeError("the MCP session manager stopped as it started")
        try:
            yield
        finally:
            done.set()
            await task

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = Headers(scope=scope)
        presented = _bearer(headers.get("authorization")) or headers.get("x-api-key")
        try:
            principal = await self._keys.authenticate(presented)
        except RingfenceError as exc:
            await _refuse(exc, send)
            return
        authenticated()  # its connection may idle as long as keep-alive allows
        assert presented is not None  # authenticate refuses a missing key
        token = AccessToken(
            token=presented, client_id=principal.key_id, scopes=[principal.role.value],
            subject=f"{principal.tenant}/{principal.key_id}",
        )  # fmt: skip
        await self._serve({**scope, "user": AuthenticatedUser(token)}, receive, send)


def _bearer(value: str | None) -> str | None:
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip() or None
    return None


async def _refuse(exc: RingfenceError, send: Send) -> None:
    """The HTTP API's answer to the same failure: its status and JSON error body."""
    status = HTTP_STATUS.get(exc.code, 500)
    body = json.dumps({"error": {"code": exc.code, "message": exc.message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
