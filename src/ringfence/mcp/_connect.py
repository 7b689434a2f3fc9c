"""How a tool call reaches Ringfence: the SDK, signed in with the right key.

The tools are written once, over the SDK. What differs between the transports is only where
the SDK's requests go and whose key they carry:

- over stdio (``ringfence mcp``) every call uses the one server and key the process was
  started with (``RemoteConnector``);
- over streamable HTTP (mounted at ``/mcp`` in ``ringfence serve``) every call uses the key
  of the HTTP request that carried it, and its requests go to the same application in this
  process (``CallerConnector``), so the HTTP API's authentication, tenancy and audit apply to
  them unchanged.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import httpx
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from starlette.requests import Request
from starlette.types import ASGIApp

from ringfence.client import AsyncRingfence, AsyncSandbox, SandboxInfo
from ringfence.client.lowlevel import Link, Settings, checked, list_params, translate
from ringfence.errors import RingfenceError, SandboxNotFound, SandboxNotRunning, Unauthenticated
from ringfence.mcp._inprocess import InProcessTransport
from ringfence.models import Forked, SandboxSpec, SandboxState

__all__ = [
    "CallerConnector",
    "Connection",
    "Connector",
    "RemoteConnector",
    "Target",
    "session",
    "tool_error",
]

_TIMEOUT = 600.0  # a command may run this long; each call sets a tighter deadline
_IN_PROCESS_URL = "http://ringfence.in-process"


@dataclass(frozen=True)
class Target:
    """Where the SDK's requests go, and the key they carry."""

    url: str
    api_key: str
    transport: httpx.AsyncBaseTransport | None = None


class Connector(Protocol):
    """Chooses the target of one tool call."""

    def target(self, ctx: Context) -> Target:
        """Raises ``Unauthenticated`` when the call carries no key."""
        ...


class RemoteConnector:
    """Every call goes to one server with one key (``ringfence mcp`` over stdio), over one
    connection pool for the process: a client per call would set up TLS and connect anew
    each time, which costs more than the call."""

    def __init__(self, url: str, api_key: str) -> None:
        self._target = Target(url.rstrip("/"), api_key, _Shared(httpx.AsyncHTTPTransport()))

    def target(self, ctx: Context) -> Target:
        return self._target


class _Shared(httpx.AsyncBaseTransport):
    """A transport that the clients of each call use, and do not close."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        pass  # it lives as long as the process


class CallerConnector:
    """Every call goes to ``app`` in this process with the key of the HTTP request that
    carried it: the endpoint authenticated that key and put it on the request."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    def target(self, ctx: Context) -> Target:
        request = ctx.request_context.request
        user = request.scope.get("user") if isinstance(request, Request) else None
        if not isinstance(user, AuthenticatedUser):
            raise Unauthenticated("this call carries no Ringfence API key")
        client = request.scope.get("client") if isinstance(request, Request) else None
        transport = InProcessTransport(self._app, client)
        return Target(_IN_PROCESS_URL, user.access_token.token, transport)


class Connection:
    """The SDK for one tool call; ``session`` opens and closes it."""

    def __init__(self, target: Target) -> None:
        self.settings = Settings.resolve(target.url, target.api_key, _TIMEOUT)
        self._transport = target.transport
        self._http = httpx.AsyncClient(
            base_url=self.settings.url, headers=self.settings.headers(),
            timeout=self.settings.timeout, transport=target.transport,
        )  # fmt: skip
        self._client: AsyncRingfence | None = None

    @property
    def client(self) -> AsyncRingfence:
        """One-shot executions and proposals."""
        if self._client is None:
            self._client = AsyncRingfence(
                self.settings.url, self.settings.api_key, transport=self._transport
            )
        return self._client

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        """A new sandbox, ready. Raises as ``AsyncSandbox.create``."""
        body = spec.model_dump(mode="json", exclude_none=True)
        return SandboxInfo.model_validate(await self._checked("POST", "/v1/sandboxes", json=body))

    async def info(self, sandbox_id: str) -> SandboxInfo:
        """Raises ``SandboxNotFound``."""
        return SandboxInfo.model_validate(await self._link(sandbox_id).rest("GET"))

    async def running(self, sandbox_id: str) -> AsyncSandbox:
        """A sandbox that runs, to drive. Raises ``SandboxNotFound``, ``SandboxNotRunning``."""
        info = await self.info(sandbox_id)
        if info.state.is_terminal:
            raise SandboxNotRunning(f"sandbox {sandbox_id} has ended ({info.state.value})")
        return AsyncSandbox(info, self._link(sandbox_id))

    async def set_timeout(self, sandbox_id: str, timeout: float) -> SandboxInfo:
        answer = await self._link(sandbox_id).rest("POST", "/timeout", {"timeout": timeout})
        return SandboxInfo.model_validate(answer)

    async def fork(self, sandbox_id: str, count: int) -> Forked:
        """Raises as ``AsyncSandbox.fork`` (its children are records here, not handles)."""
        answer = await self._link(sandbox_id).rest("POST", "/fork", {"count": count})
        return Forked.model_validate(answer)

    async def kill(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo.model_validate(await self._link(sandbox_id).rest("DELETE"))

    async def list(
        self, states: Iterable[SandboxState], metadata: Mapping[str, str], limit: int
    ) -> builtins.list[SandboxInfo]:
        params = list_params(list(states), metadata, limit)
        answer = await self._checked("GET", "/v1/sandboxes", params=params)
        return [SandboxInfo.model_validate(item) for item in answer]

    def _link(self, sandbox_id: str) -> Link:
        return Link(self.settings, sandbox_id, self._http)

    async def _checked(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise translate(exc, self.settings.url) from exc
        return checked(response, SandboxNotFound)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        await self._http.aclose()


def tool_error(exc: RingfenceError) -> ToolError:
    """What the agent reads when a call fails: the error's stable code and its message."""
    return ToolError(f"{exc.code}: {exc.message}")


@asynccontextmanager
async def session(connector: Connector, ctx: Context) -> AsyncIterator[Connection]:
    """The SDK for this call; Ringfence's errors come out as tool errors (``isError``)."""
    try:
        connection = Connection(connector.target(ctx))
        try:
            yield connection
        finally:
            with anyio.CancelScope(shield=True):  # closed even when the call is cancelled
                await connection.aclose()
    except RingfenceError as exc:
        raise tool_error(exc) from exc
