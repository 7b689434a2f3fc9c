"""The Chrome DevTools Protocol of a sandbox's browser, through the server (design 15.5).

So that Playwright's ``chromium.connect_over_cdp`` and Puppeteer's ``connect`` drive a
sandboxed Chromium:

- ``GET /v1/sandboxes/{id}/browser/cdp``, a WebSocket: relayed to the browser target
  (``/devtools/browser/<id>``) of the Chromium the sandbox's browser agent runs with
  ``--remote-debugging-port=CDP_PORT`` on the sandbox's own 127.0.0.1, through the
  daemon's port tunnel, by ``port_relay``'s WebSocket relay;
- ``GET /v1/sandboxes/{id}/browser/cdp/json/version`` (and ``.../json/version/``, what
  Playwright asks when given the ``http://`` form): Chromium's answer with its
  ``webSocketDebuggerUrl`` made the WebSocket above, on this server.

Both start the sandbox's browser when it is not running (``CdpPaths``). Callers: a key of
the sandbox's tenant or its traffic access token, as the port routes take them
(``routes.ports.caller_of``); never an anonymous caller, even of a ``public_traffic``
sandbox: a CDP client owns the browser, its cookies and every page
(``Ports.admit_browser``). Nothing the client sends in its head reaches Chromium: not
Ringfence's credentials, not its ``Origin`` (Chromium refuses unknown origins, and a web
page's must never pass), not its ``Host`` (Chromium serves only ``127.0.0.1:CDP_PORT``'s
kind). Each message from Chromium is bounded by ``max_browser_result_bytes`` (screenshots
are several MiB); the relay takes its weight in the server's WebSocket slots, within the
browsers' share of them (``WebSocketSlots``: the rest is kept for preview URLs), and CDP
WebSockets open at once are bounded per tenant and per sandbox (``CdpSessions``), so that
idle sessions of one tenant cannot hold every relay. Each one admitted is audited as
``browser.cdp_open`` with what came of it: ok once open, failed with the refusal's code.

An ASGI layer like the port routes' (inside them: a preview host name never reaches it),
so the API's body limit and JSON routing stay out of a WebSocket's way.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any, Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from ringfence.errors import InvalidRequest, RingfenceError, TooManyRequests
from ringfence.sandboxd.browser import CDP_PORT
from ringfence.server.e2b.tokens import Grants
from ringfence.server.port_relay import Broken, WebSocketSlots, fetch, relay_websocket
from ringfence.server.routes.ports import caller_of, host_of, refuse
from ringfence.service.keys import Keys
from ringfence.service.ports import Admitted, PortCaller, Ports

__all__ = ["CDP_PATH", "CdpLayer", "CdpPaths", "CdpSessions", "documented"]

CDP_PATH = "/v1/sandboxes/{sandbox_id}/browser/cdp"
_PATH = re.compile(rb"^/v1/sandboxes/([A-Za-z0-9]{1,64})/browser/cdp(/json/version/?)?$")
_CHROMIUM_HOST = f"127.0.0.1:{CDP_PORT}"  # the only kind of Host Chromium serves
_BROWSER_TARGET = re.compile(r"^/devtools/browser/[A-Za-z0-9-]{1,64}$")
_VERSION_KEYS = (
    "Browser", "File-Path-Style", "Protocol-Version", "User-Agent", "V8-Version", "WebKit-Version",
)  # fmt: skip
_MAX_VERSION = 64 * 1024
_HOST = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")


class CdpPaths(Protocol):
    """What the CDP route needs of the browser service (``BrowserService`` is one)."""

    async def cdp_path(self, tenant: str, sandbox_id: str) -> str:
        """The browser target's WebSocket path on ``CDP_PORT`` (``/devtools/browser/<id>``),
        the sandbox's agent and Chromium started first if they are not running.

        Raises:
            SandboxNotFound, SandboxNotRunning, and the browser's own errors (its agent
            failed or is not installed): RingfenceErrors, answered as they map.
        """
        ...


class CdpSessions:
    """The CDP WebSockets open at once, bounded per tenant and per sandbox
    (``max_cdp_sessions_per_tenant``, ``max_cdp_sessions_per_sandbox``)."""

    def __init__(self, per_tenant: int, per_sandbox: int) -> None:
        self.per_tenant = per_tenant
        self.per_sandbox = per_sandbox
        self._tenants: Counter[str] = Counter()
        self._sandboxes: Counter[str] = Counter()

    @contextlib.contextmanager
    def held(self, tenant: str, sandbox_id: str) -> Iterator[None]:
        """Count one session of ``tenant``'s sandbox while the block runs.

        Raises:
            TooManyRequests: the tenant, or the sandbox, has its most open.
        """
        if self._sandboxes[sandbox_id] >= self.per_sandbox:
            raise TooManyRequests(
                f"sandbox {sandbox_id} has {self.per_sandbox} CDP WebSockets open, its most "
                "(max_cdp_sessions_per_sandbox); close one or retry later"
            )
        if self._tenants[tenant] >= self.per_tenant:
            raise TooManyRequests(
                f"your tenant has {self.per_tenant} CDP WebSockets open, its most "
                "(max_cdp_sessions_per_tenant); close one or retry later"
            )
        self._tenants[tenant] += 1
        self._sandboxes[sandbox_id] += 1
        try:
            yield
        finally:
            for counter, key in ((self._tenants, tenant), (self._sandboxes, sandbox_id)):
                counter[key] -= 1
                if counter[key] <= 0:
                    del counter[key]


class CdpLayer:
    """ASGI middleware: the CDP routes to their sandbox's Chromium, the rest to ``app``."""

    def __init__(
        self, app: ASGIApp, *, ports: Ports, keys: Keys, grants: Grants,
        browser: CdpPaths, websockets: WebSocketSlots, max_message: int,
        sessions: CdpSessions | None = None,
    ) -> None:  # fmt: skip
        """``browser`` starts the sandbox's browser and names its target; ``max_message``:
        the largest message from Chromium, in bytes (past it the WebSocket closes with
        1009); ``sessions``: the bounds on CDP WebSockets open at once (by default 2 per
        tenant and per sandbox, ``Config``'s)."""
        self.app = app
        self._sessions = sessions or CdpSessions(2, 2)
        self._ports = ports
        self._keys = keys
        self._grants = grants
        self._browser = browser
        self._slots = websockets
        self._max_message = max_message

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        raw: bytes = scope.get("raw_path") or scope["path"].encode("latin-1", "replace")
        found = _PATH.fullmatch(raw)
        if found is None:
            await self.app(scope, receive, send)
            return
        sandbox_id, version = found.group(1).decode(), found.group(2) is not None
        websocket = scope["type"] == "websocket"
        try:
            if websocket == version:
                raise InvalidRequest(
                    "the CDP endpoint is a WebSocket at .../browser/cdp; its HTTP form is "
                    "GET .../browser/cdp/json/version"
                )
            if not websocket and scope["method"] not in ("GET", "HEAD"):
                raise InvalidRequest(f"{scope['method']} is not served here: GET json/version")
            caller = await caller_of(scope, sandbox_id, self._keys, self._grants)
            admitted = await self._ports.admit_browser(caller, sandbox_id)
            if websocket:
                await self._relay(scope, receive, send, caller, admitted)
            else:
                await self._version(scope, send, admitted)
        except RingfenceError as error:
            await refuse(scope, send, error)

    async def _relay(
        self, scope: Scope, receive: Receive, send: Send, caller: PortCaller, admitted: Admitted
    ) -> None:
        """Relay an admitted CDP WebSocket, and record what came of it: ok once open,
        failed with its code when refused (bounds, the browser's start, Chromium's
        handshake)."""
        recorded = False

        def record(error: str | None = None) -> None:
            nonlocal recorded
            if not recorded:
                recorded = True
                self._ports.record_cdp_open(caller, admitted, error)

        try:
            with (
                self._sessions.held(admitted.tenant, admitted.sandbox_id),
                self._slots.held(self._max_message, browser=True),
            ):
                target = await self._target(admitted)
                tunnel = await self._ports.connect(admitted)
                try:
                    await relay_websocket(
                        scope, receive, send, tunnel, host=_CHROMIUM_HOST, target=target,
                        headers=[], max_message=self._max_message, accepted=record,
                        refused=lambda status: record(f"chromium_refused_{status}"),
                    )  # fmt: skip
                except Broken as broken:
                    error = _bad_gateway(admitted, str(broken))
                    record(error.code)
                    await refuse(scope, send, error)
                finally:
                    await tunnel.aclose()
        except RingfenceError as error:
            record(error.code)
            raise
        except BaseException:  # the client went away (cancelled) before it was open
            record("cancelled")
            raise

    async def _version(self, scope: Scope, send: Send, admitted: Admitted) -> None:
        await self._browser.cdp_path(admitted.tenant, admitted.sandbox_id)  # started
        answer = await self._chromium_version(admitted)
        version = {k: answer[k] for k in _VERSION_KEYS if isinstance(answer.get(k), str)}
        version["webSocketDebuggerUrl"] = _endpoint(scope, admitted.sandbox_id)
        body = json.dumps(version).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        head_only = scope["method"] == "HEAD"
        await send({"type": "http.response.body", "body": b"" if head_only else body})

    async def _target(self, admitted: Admitted) -> str:
        """The browser target's path (the browser started first if need be)."""
        path = await self._browser.cdp_path(admitted.tenant, admitted.sandbox_id)
        if not _BROWSER_TARGET.fullmatch(path):  # the sandbox's word: checked, never trusted
            raise _bad_gateway(admitted, f"the browser named no browser target ({path[:80]!r})")
        return path

    async def _chromium_version(self, admitted: Admitted) -> dict[str, object]:
        """Chromium's ``/json/version`` answer, asked through a tunnel (counted)."""
        tunnel = await self._ports.connect(admitted)
        try:
            status, body = await fetch(
                tunnel, target=b"/json/version", headers=[(b"host", _CHROMIUM_HOST.encode())],
                max_body=_MAX_VERSION,
            )  # fmt: skip
        except Broken as broken:
            raise _bad_gateway(admitted, str(broken)) from broken
        finally:
            await tunnel.aclose()
        try:
            answer = json.loads(body) if status == 200 else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise _bad_gateway(admitted, f"Chromium's /json/version answered {status}, not JSON")
        return answer


def _endpoint(scope: Scope, sandbox_id: str) -> str:
    """This server's WebSocket URL of the sandbox's CDP endpoint, as the caller reached it.

    Raises:
        InvalidRequest: a Host header that is not a host name or address (and port).
    """
    host = host_of(scope)
    if host is None or not _HOST.fullmatch(host):
        raise InvalidRequest("the request's Host header is not a host name (and port)")
    scheme = "wss" if scope.get("scheme") == "https" else "ws"
    return f"{scheme}://{host}{CDP_PATH.format(sandbox_id=sandbox_id)}"


def _bad_gateway(admitted: Admitted, why: str) -> RingfenceError:
    error = RingfenceError(f"the browser of sandbox {admitted.sandbox_id}: {why}")
    error.code = "bad_gateway"
    return error


def documented(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (the app's OpenAPI dict) with the CDP routes added, in place: a layer
    in front of the app serves them, so FastAPI does not see them."""
    error = {
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    }

    def failing(description: str) -> dict[str, Any]:
        return {"description": description, **error}

    parameters = [
        {"name": "sandbox_id", "in": "path", "required": True, "description": "The sandbox's id.",
         "schema": {"type": "string", "pattern": "^[A-Za-z0-9]{1,64}$"}},
    ]  # fmt: skip
    refusals = {
        "400": failing("Not a WebSocket upgrade, or a method other than GET (invalid_request)"),
        "401": failing(
            "No valid credential: a key of the sandbox's tenant or its traffic access token "
            "(E2B-Traffic-Access-Token); never anonymous, public_traffic or not (unauthenticated)"
        ),
        "404": failing("No such sandbox in your tenant (not_found)"),
        "409": failing("The sandbox has ended, or is paused with auto_resume off"),
        "429": failing("The server relays its most WebSockets (or CDP ones, their share), "
                       "your tenant or the sandbox has its most CDP WebSockets open "
                       "(max_cdp_sessions_per_tenant, max_cdp_sessions_per_sandbox), or the "
                       "sandbox has its most connections to its ports open (too_many_requests)"),
        "500": failing("An unexpected error, logged by the server (internal)"),
        "502": failing("The sandbox's browser failed, or broke the protocol (browser_failed, "
                       "bad_gateway, sandbox_error)"),
        "503": failing("The sandbox's template has no Chromium (browser_unavailable), or the "
                       "store is unavailable (store_error)"),
        "504": failing("The browser did not start in time (browser_timeout)"),
    }  # fmt: skip
    security: list[dict[str, list[str]]] = [{"HTTPBearer": []}, {"APIKeyHeader": []}]
    version_schema = {
        "type": "object",
        "properties": {key: {"type": "string"} for key in (*_VERSION_KEYS, "webSocketDebuggerUrl")},
        "required": ["webSocketDebuggerUrl"],
    }
    paths = document.setdefault("paths", {})
    paths[CDP_PATH] = {
        "get": {
            "tags": ["browser"],
            "summary": "The Chrome DevTools Protocol of the sandbox's browser (a WebSocket)",
            "description": (
                "Open it as a WebSocket (Playwright's connect_over_cdp, Puppeteer's connect "
                "with browserWSEndpoint): relayed to the browser target of the sandbox's "
                "Chromium, started if it is not running. Nothing of the handshake's headers "
                "reaches Chromium. Each message from it is at most max_browser_result_bytes "
                "(past it: closed with 1009). Audited as browser.cdp_open (docs/browser.md)."
            ),
            "operationId": "browser_cdp",
            "parameters": parameters,
            "responses": {"101": {"description": "The CDP WebSocket"}, **refusals},
            "security": security,
        }
    }
    paths[CDP_PATH + "/json/version"] = {
        "get": {
            "tags": ["browser"],
            "summary": "Chromium's version, naming this server's CDP WebSocket",
            "description": (
                "What Playwright's connect_over_cdp asks of an http:// endpoint (with or "
                "without a trailing slash): Chromium's /json/version answer, its "
                "webSocketDebuggerUrl this server's ws(s):// URL of the CDP WebSocket. "
                "Starts the sandbox's browser if it is not running."
            ),
            "operationId": "browser_cdp_version",
            "parameters": parameters,
            "responses": {
                "200": {
                    "description": "Chromium's version",
                    "content": {"application/json": {"schema": version_schema}},
                },
                **refusals,
            },
            "security": security,
        }
    }
    return document
