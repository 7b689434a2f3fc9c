"""Preview URLs: a server a sandbox runs on a port, reached from outside through Ringfence.

Two forms reach port P of sandbox S (docs/ports.md):

- the path route ``/v1/sandboxes/S/ports/P/...``, always (the sandbox's server sees the
  rest of the path, ``/...``);
- the host name ``P-S.{ports_domain}``, any path, when the operator set ``ports_domain``
  (what E2B's ``get_host(P)`` returns).

Both are one ASGI layer in front of everything else: a request under the preview domain
never reaches the API, and these routes stream both ways with no body limit (the sandbox's
server takes what it takes). HTTP and WebSocket pass; the sandbox's answer goes back as it
is, but for the hop-by-hop headers and, on the path route, what would let the sandbox act
as Ringfence's own origin there (``_PATH_ANSWER``).

Who may pass is ``service.ports``'s to decide; this layer finds the credential: the
sandbox's traffic access token (``E2B-Traffic-Access-Token``), or a Ringfence key
(``Authorization: Bearer rf_...`` or ``X-API-Key``), or none. Ringfence's credentials never
reach the sandbox: those headers, and on the path route every cookie (they are Ringfence's
origin's: the console's session among them), are removed before the request is passed on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.types import ASGIApp, Receive, Scope, Send

from ringfence.errors import (
    HTTP_STATUS,
    InvalidRequest,
    RingfenceError,
    Unauthenticated,
)
from ringfence.server.connections import authenticated
from ringfence.server.console.sessions import COOKIE, LOGIN_COOKIE
from ringfence.server.e2b.tokens import Grants, Purpose
from ringfence.server.e2b.traffic import CODE_PORT, ENVD_PORT
from ringfence.server.port_pool import IdleTunnels
from ringfence.server.port_relay import Broken, Headers, WebSocketSlots, relay_http, relay_websocket
from ringfence.service.keys import Keys
from ringfence.service.ports import Admitted, PortCaller, Ports

__all__ = [
    "PATH_PREFIX", "TOKEN_HEADER", "PortLayer", "caller_of", "documented", "host_of", "path_of",
    "preview_host", "refuse",
]  # fmt: skip

TOKEN_HEADER = "e2b-traffic-access-token"
PATH_PREFIX = "/v1/sandboxes/{sandbox_id}/ports/{port}/"
_PATH = re.compile(rb"^/v1/sandboxes/([^/]*)/ports/([^/]*)(/.*)?$", re.DOTALL)
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9]{1,64}$")
_HOST_LABEL = re.compile(r"^([0-9]{1,5})-([a-z0-9]{1,57})$")
# Never passed on: Ringfence's credentials, E2B's routing, and what this layer sets itself.
_CREDENTIALS = frozenset({TOKEN_HEADER.encode(), b"x-access-token", b"x-api-key"})
_DROPPED = _CREDENTIALS | {
    b"e2b-sandbox-id", b"e2b-sandbox-port", b"forwarded", b"x-forwarded-for",
    b"x-forwarded-host", b"x-forwarded-proto", b"x-forwarded-prefix",
}  # fmt: skip
_CONSOLE_COOKIES = (COOKIE, LOGIN_COOKIE)
# The path route shares Ringfence's origin: the sandbox's pages run in an opaque origin
# (CSP sandbox, without allow-same-origin) and set no cookie there.
_PATH_ANSWER: Headers = [
    (
        b"content-security-policy",
        b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads",
    )
]
# What acts on the whole origin (Ringfence's, on the path route), not on the page: never
# from the sandbox there (review 2a #5). ``Location`` passes only when it stays on the
# origin (``_same_origin_location``).
_PATH_DROPPED_ANSWER = frozenset(
    {
        b"set-cookie", b"set-cookie2", b"clear-site-data", b"strict-transport-security",
        b"refresh", b"service-worker-allowed", b"alt-svc", b"origin-agent-cluster", b"link",
        b"public-key-pins", b"expect-ct", b"nel", b"report-to", b"reporting-endpoints",
        b"access-control-allow-credentials",
    }
)  # fmt: skip
_SCHEME = re.compile(rb"^[A-Za-z][A-Za-z0-9+.-]*:")


def _same_origin_location(value: bytes) -> bool:
    """Whether a ``Location`` is a relative reference that stays on the origin: no scheme,
    no authority (``//host``, and ``/\\host``, which browsers read the same), once the tabs
    and newlines browsers remove are removed."""
    cleaned = value.replace(b"\t", b"").replace(b"\n", b"").replace(b"\r", b"").strip()
    if cleaned[:2].replace(b"\\", b"/") == b"//" or cleaned.startswith(b"\\"):
        return False
    return _SCHEME.match(cleaned.split(b"/", 1)[0].split(b"?", 1)[0]) is None


def _path_answer_filter(headers: Headers) -> Headers:
    """The sandbox's answer headers allowed on the path route (Ringfence's origin)."""
    return [
        (n, v) for n, v in headers
        if n not in _PATH_DROPPED_ANSWER and (n != b"location" or _same_origin_location(v))
    ]  # fmt: skip


@dataclass(frozen=True)
class _Target:
    sandbox_id: str
    port: int
    path: bytes  # what the sandbox's server is asked for: its path and query
    via: str  # "path" or "host"
    prefix: str  # the path route's prefix (X-Forwarded-Prefix), "" for the host form


def path_of(sandbox_id: str, port: int) -> str:
    """The path route of a sandbox's port (with its trailing slash)."""
    return PATH_PREFIX.format(sandbox_id=sandbox_id, port=port)


def preview_host(sandbox_id: str, port: int, domain: str) -> str:
    """The host name of a sandbox's port under ``domain`` (E2B's ``get_host``)."""
    return f"{port}-{sandbox_id}.{domain}"


class PortLayer:
    """ASGI middleware: preview-URL requests to their sandbox, the rest to ``app``."""

    def __init__(
        self, app: ASGIApp, *, ports: Ports, keys: Keys, grants: Grants, domain: str | None,
        max_websocket_message: int = 1024 * 1024, max_websockets: int = 256,
        websockets: WebSocketSlots | None = None,
    ) -> None:  # fmt: skip
        """``max_websockets`` WebSockets are relayed at once, server-wide, each message
        (either way) at most ``max_websocket_message`` bytes: together they bound the
        memory relayed WebSockets hold (review 2a #2). ``websockets``: the server's slots,
        when other layers relay WebSockets too (the CDP route: ``routes.browser_cdp``)."""
        self.app = app
        self._max_message = max_websocket_message
        self._slots = websockets or WebSocketSlots(max_websockets, max_websocket_message)
        self._ports = ports
        self._keys = keys
        self._grants = grants
        self._domain = domain
        self._idle = IdleTunnels()  # kept-alive connections to the sandboxes' servers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            target = self._target(scope)
        except RingfenceError as error:
            await refuse(scope, send, error)
            return
        if target is None:
            await self.app(scope, receive, send)
            return
        if target.via == "host" and str(target.port) in (ENVD_PORT, CODE_PORT):
            await self.app(_to_e2b_door(scope, target), receive, send)
            return
        try:
            caller = await self._caller(scope, target.sandbox_id)
            admitted = await self._ports.admit(
                caller, target.sandbox_id, target.port, via=target.via
            )
            if scope["type"] == "websocket":
                await self._websocket(scope, receive, send, target, admitted)
            else:
                await self._http(scope, receive, send, target, admitted, caller.actor)
        except RingfenceError as error:
            await refuse(scope, send, error)

    async def _websocket(
        self, scope: Scope, receive: Receive, send: Send, target: _Target, admitted: Admitted
    ) -> None:
        with self._slots.held(self._max_message):
            tunnel = await self._ports.connect(admitted)
            try:
                await relay_websocket(
                    scope, receive, send, tunnel, host=host_of(scope) or "sandbox",
                    target=target.path.decode("latin-1"), headers=_passed_on(scope, target),
                    max_message=self._max_message,
                )  # fmt: skip
            except Broken as broken:
                await refuse(scope, send, _bad_gateway(target, str(broken)))
            finally:
                await tunnel.aclose()

    @property
    def websockets(self) -> int:
        """WebSocket slots held now, server-wide (a relay of larger messages holds more)."""
        return self._slots.taken

    async def _http(
        self, scope: Scope, receive: Receive, send: Send, target: _Target, admitted: Admitted,
        actor: str,
    ) -> None:  # fmt: skip
        """On a kept-alive tunnel of the same client connection when one is idle
        (``port_pool``); one the sandbox's server closed meanwhile is retried once on a new
        tunnel, for a request without a body (nothing of it was sent to the client yet).
        Without the client's address (an ASGI server that gives none) nothing is reused."""
        client = scope.get("client")
        downstream = f"{client[0]}:{client[1]}" if client else None
        key = None if downstream is None else (target.sandbox_id, target.port, actor, downstream)
        headers = _passed_on(scope, target)
        bodiless = not any(n in (b"content-length", b"transfer-encoding") for n, _ in headers)
        idle = self._idle.take(key) if key is not None else None
        while True:
            if idle is not None:
                tunnel, connection = idle
            else:
                while not self._ports.has_room(admitted) and self._idle.close_one(
                    target.sandbox_id
                ):
                    pass  # idle tunnels make room first (an anonymous one, at its share)
                tunnel, connection = await self._ports.connect(admitted), None
            try:
                kept = await relay_http(
                    scope, receive, send, tunnel, target=target.path, headers=headers,
                    answer_headers=_PATH_ANSWER if target.via == "path" else [],
                    answer_filter=_path_answer_filter if target.via == "path" else None,
                    connection=connection,
                )  # fmt: skip
            except Broken as broken:
                tunnel.discard()
                if idle is not None and bodiless:
                    idle = None
                    continue
                await refuse(scope, send, _bad_gateway(target, str(broken)))
                return
            except BaseException:
                tunnel.discard()
                raise
            if kept is not None and key is not None:
                self._idle.put(key, tunnel, kept)
            else:
                await tunnel.aclose()
            return

    def _target(self, scope: Scope) -> _Target | None:
        """Where the request goes, or None when it is not a preview-URL request.

        Raises:
            InvalidRequest: a preview URL with a malformed port or sandbox id, or a name
                under the preview domain that is not one.
        """
        query: bytes = scope.get("query_string", b"")
        raw: bytes = scope.get("raw_path") or quote(scope["path"]).encode()
        host = host_of(scope)
        if self._domain is not None and host is not None:
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            name = name.lower().rstrip(".")
            if name == self._domain or name.endswith("." + self._domain):
                label = name[: -len(self._domain) - 1] if name != self._domain else ""
                match = _HOST_LABEL.fullmatch(label)
                if match is None:
                    raise InvalidRequest(
                        f"{name} is not a preview URL: it reads {{port}}-{{sandbox id}}."
                        f"{self._domain}"
                    )
                port = _port(match.group(1))
                path = raw + (b"?" + query if query else b"")
                return _Target(match.group(2), port, path, "host", "")
        found = _PATH.fullmatch(raw)
        if found is None:
            return None
        sandbox_id = found.group(1).decode("latin-1")
        if not _SANDBOX_ID.fullmatch(sandbox_id):
            raise InvalidRequest("the sandbox id of a port route is letters and digits")
        port = _port(found.group(2).decode("latin-1"))
        rest = found.group(3) or b"/"
        prefix = f"/v1/sandboxes/{sandbox_id}/ports/{port}"
        return _Target(sandbox_id, port, rest + (b"?" + query if query else b""), "path", prefix)

    async def _caller(self, scope: Scope, sandbox_id: str) -> PortCaller:
        return await caller_of(scope, sandbox_id, self._keys, self._grants)


async def caller_of(scope: Scope, sandbox_id: str, keys: Keys, grants: Grants) -> PortCaller:
    """Who calls, by the credential presented (none: anonymous): the sandbox's traffic
    access token, or a Ringfence key (``X-API-Key``, a Bearer ``rf_...``).

    Raises:
        Unauthenticated: a token or key that is not valid (never taken for none).
    """
    token = _header(scope, TOKEN_HEADER.encode())
    if token is not None:
        grant = grants.check(token, sandbox_id, Purpose.TRAFFIC)
        if grant is None or not await keys.in_force(grant.key_id, grant.generation):
            raise Unauthenticated(
                f"the traffic access token is not valid for sandbox {sandbox_id} (or its "
                "key was revoked or rotated since)"
            )
        authenticated()
        return PortCaller(grant.tenant, grant.key_id, "token")
    key = _ringfence_key(scope)
    if key is not None:
        principal = await keys.authenticate(key)
        authenticated()
        return PortCaller(principal.tenant, principal.key_id, "key")
    return PortCaller.anonymous()


def _to_e2b_door(scope: Scope, target: _Target) -> Scope:
    """envd's and the code interpreter's host names (E2B's SDKs without E2B_SANDBOX_URL)
    are E2B's sandbox traffic: the request goes to its door, naming its sandbox and port
    as E2B_SANDBOX_URL's requests do."""
    routing = (b"e2b-sandbox-id", b"e2b-sandbox-port")
    headers = [(n, v) for n, v in scope["headers"] if n.lower() not in routing]
    headers += [(routing[0], target.sandbox_id.encode()), (routing[1], str(target.port).encode())]
    return {**scope, "headers": headers}


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < len(text) <= 5 and text[0] != "0"):
        raise InvalidRequest(f"the port of a preview URL is a number from 1 to 65535, not {text!r}")
    port = int(text)
    if port > 65535:
        raise InvalidRequest(f"the port of a preview URL is from 1 to 65535, not {port}")
    return port


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def host_of(scope: Scope) -> str | None:
    """The request's Host header, as sent."""
    return _header(scope, b"host")


def _ringfence_key(scope: Scope) -> str | None:
    """A Ringfence key the request presents (``X-API-Key``, or a Bearer ``rf_...``); any
    other Authorization is the sandbox's server's own and passes."""
    key = _header(scope, b"x-api-key")
    if key is not None:
        return key
    auth = _header(scope, b"authorization")
    if auth is not None and _is_ringfence_bearer(auth):
        return auth[7:].strip()
    return None


def _is_ringfence_bearer(value: str) -> bool:
    return value[:7].lower() == "bearer " and value[7:].strip().startswith("rf_")


def _passed_on(scope: Scope, target: _Target) -> Headers:
    """The request's headers as they go to the sandbox: Ringfence's credentials and cookies
    out, where it came from in (``X-Forwarded-*``)."""
    kept: Headers = []
    for name, value in scope["headers"]:
        name = name.lower()
        if name in _DROPPED:
            continue
        if name == b"authorization" and _is_ringfence_bearer(value.decode("latin-1")):
            continue
        if name == b"cookie":
            if target.via == "path":
                continue
            value = _without_console_cookies(value)
            if not value:
                continue
        kept.append((name, value))
    client = scope.get("client")
    if client:
        kept.append((b"x-forwarded-for", str(client[0]).encode()))
    kept.append(
        (b"x-forwarded-proto", b"https" if scope.get("scheme") in ("https", "wss") else b"http")
    )
    host = host_of(scope)
    if host:
        kept.append((b"x-forwarded-host", host.encode("latin-1")))
    if target.prefix:
        kept.append((b"x-forwarded-prefix", target.prefix.encode()))
    if not any(name == b"host" for name, _ in kept):
        kept.insert(0, (b"host", b"sandbox"))
    return kept


def _without_console_cookies(value: bytes) -> bytes:
    parts = [p.strip() for p in value.split(b";")]
    names = tuple(c.encode() for c in _CONSOLE_COOKIES)
    return b"; ".join(p for p in parts if p and p.split(b"=", 1)[0].strip() not in names)


def _bad_gateway(target: _Target, why: str) -> RingfenceError:
    error = RingfenceError(f"port {target.port} of sandbox {target.sandbox_id}: {why}")
    error.code = "bad_gateway"
    return error


async def refuse(scope: Scope, send: Send, error: RingfenceError) -> None:
    status = HTTP_STATUS.get(error.code, 502 if error.code == "bad_gateway" else 500)
    body = json.dumps({"error": {"code": error.code, "message": error.message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="ringfence"'))
    if scope["type"] == "websocket":
        if "websocket.http.response" in scope.get("extensions", {}):
            await send(
                {"type": "websocket.http.response.start", "status": status, "headers": headers}
            )
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008})
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_DOCUMENTED_METHODS = ("get", "post", "put", "patch", "delete")


def documented(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (the app's OpenAPI dict) with the path route added, in place: a layer
    in front of the app serves it, so FastAPI does not see it."""
    error = {
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    }

    def failing(description: str) -> dict[str, Any]:
        return {"description": description, **error}

    parameters = [
        {"name": "sandbox_id", "in": "path", "required": True, "description": "The sandbox's id.",
         "schema": {"type": "string", "pattern": "^[A-Za-z0-9]{1,64}$"}},
        {"name": "port", "in": "path", "required": True,
         "description": "The port a server listens on in the sandbox (its own loopback).",
         "schema": {"type": "integer", "minimum": 1, "maximum": 65535}},
        {"name": "path", "in": "path", "required": True,
         "description": "The rest of the path, as the sandbox's server is asked for it.",
         "schema": {"type": "string"}},
    ]  # fmt: skip
    responses = {
        "default": {"description": "What the sandbox's server answers, streamed as it comes"},
        "400": failing("A port that is not from 1 to 65535, or a malformed id (invalid_request)"),
        "401": failing(
            "No valid credential: a key of the sandbox's tenant or its traffic access token "
            "(E2B-Traffic-Access-Token) is needed unless it has public_traffic (unauthenticated)"
        ),
        "403": failing("A port Ringfence itself listens on in the sandbox (forbidden)"),
        "404": failing("No such sandbox in your tenant (not_found)"),
        "409": failing("The sandbox has ended, or is paused with auto_resume off"),
        "429": failing("The sandbox has its most connections open (too_many_requests)"),
        "500": failing("An unexpected error, logged by the server (internal)"),
        "503": failing("The store is unavailable while the credential is checked (store_error)"),
        "502": failing(
            "Nothing listens on the port in the sandbox (port_not_listening), or its server "
            "broke HTTP (bad_gateway)"
        ),
    }
    operations = {
        method: {
            "tags": ["ports"],
            "summary": "Reach a server the sandbox runs on a port (a preview URL)",
            "description": (
                "Passed to the server listening on the port on the sandbox's own loopback, "
                "bodies streamed both ways; a WebSocket upgrade passes too. The same is "
                "served at {port}-{sandbox_id}.{ports_domain} when the server has a preview "
                "domain. Ringfence's credentials and, here, cookies are not passed on; the "
                "answer comes back with Content-Security-Policy: sandbox and no Set-Cookie "
                "(docs/ports.md)."
            ),
            "operationId": f"port_{method}",
            "parameters": parameters,
            "responses": responses,
            "security": [{"HTTPBearer": []}, {"APIKeyHeader": []}, {}],
        }
        for method in _DOCUMENTED_METHODS
    }
    document.setdefault("paths", {})["/v1/sandboxes/{sandbox_id}/ports/{port}/{path}"] = operations
    return document
