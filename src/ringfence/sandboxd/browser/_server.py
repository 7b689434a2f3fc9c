"""The agent's HTTP/1.1 JSON server on 127.0.0.1 (the package docstring's wire protocol).

Connections are served on threads, so a slow client only holds its own; the calls
themselves take one lock (one call at a time, later ones wait their turn). A request body
is read in full before the lock, up to ``MAX_BODY`` bytes, with a socket timeout. A call
that timed out is answered first; the stuck tab is replaced after, still under the lock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ._cdp import Deadline
from ._errors import AgentError
from ._request import parse
from ._session import START_SECONDS, Session

MAX_BODY = 32 * 1024 * 1024
_SOCKET_TIMEOUT = 60.0


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, session: Session) -> None:
        self.session = session
        self.call_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = _SOCKET_TIMEOUT
    server: AgentServer

    def do_GET(self) -> None:
        if self._from_a_page():
            return
        if self.path == "/health":
            self._call(lambda session, _: session.status(), body=False)
        elif self.path == "/cdp":
            self._call(lambda session, _: {"path": session.devtools_path()}, body=False)
        else:
            self._answer(404, {"error": {"code": "invalid_request", "message": "no such path"}})

    def do_POST(self) -> None:
        if self._from_a_page():
            return
        routes: dict[str, Callable[[Session, Any], dict[str, Any]]] = {
            "/scrape": lambda session, raw: session.scrape(parse(raw)),
            "/start": _start,
            "/close": _close,
        }
        route = routes.get(self.path)
        if route is None:
            self._drain()
            self._answer(404, {"error": {"code": "invalid_request", "message": "no such path"}})
            return
        self._call(route, body=True)

    def _from_a_page(self) -> bool:
        """Refuse (and answer) a request a web page made: any page Chromium renders can
        send requests to the sandbox's loopback, this port included. Browsers mark theirs
        (``Origin``, ``Sec-Fetch-*``), a rebound name shows in ``Host``, and a JSON body
        cannot be sent across origins without a preflight this server never answers."""
        headers = self.headers
        why = None
        if headers.get("Origin") is not None or any(
            name.lower().startswith("sec-fetch-") for name in headers
        ):
            why = "requests made by a web page are refused"
        elif _host_name(headers.get("Host", "")) not in _LOOPBACK_NAMES:
            why = "the Host must be this sandbox's loopback"
        elif (
            self.command == "POST"
            and headers.get("Content-Length", "0") != "0"
            and (
                headers.get("Content-Type", "").split(";")[0].strip().lower() != "application/json"
            )
        ):
            why = "a body must be application/json"
        if why is None:
            return False
        self.close_connection = True
        self._answer(400, {"error": {"code": "invalid_request", "message": why}})
        return True

    def _call(self, route: Callable[[Session, Any], dict[str, Any]], *, body: bool) -> None:
        try:
            raw = self._body() if body else None
            with self.server.call_lock:
                session = self.server.session
                try:
                    answer = route(session, raw)
                except AgentError as error:
                    self._answer(error.status, error.body())
                else:
                    self._answer(200, answer)
                session.recover()
        except AgentError as error:
            self._answer(error.status, error.body())

    def _body(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None and self.headers.get("Transfer-Encoding") is None:
            return {}  # no body: every field at its default
        if length is None or not length.isdigit():
            self.close_connection = True
            raise AgentError("invalid_request", "body: a Content-Length is required")
        size = int(length)
        if size > MAX_BODY:
            self.close_connection = True
            raise AgentError("invalid_request", f"body: larger than {MAX_BODY} bytes")
        data = self.rfile.read(size)
        if not data:
            return {}
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as error:
            raise AgentError("invalid_request", f"body: not JSON ({error})") from error

    def _drain(self) -> None:
        length = self.headers.get("Content-Length", "0")
        if length.isdigit() and int(length) <= MAX_BODY:
            self.rfile.read(int(length))
        else:
            self.close_connection = True

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        return


_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]", "")


def _host_name(host: str) -> str:
    """``Host`` without its port: ``127.0.0.1:49990`` -> ``127.0.0.1``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.split("]")[0] + "]"
    return host.rsplit(":", 1)[0] if ":" in host else host


def _start(session: Session, _: Any) -> dict[str, Any]:
    session.start(Deadline(START_SECONDS))
    return session.status()


def _close(session: Session, _: Any) -> dict[str, Any]:
    session.end()
    return session.status()
