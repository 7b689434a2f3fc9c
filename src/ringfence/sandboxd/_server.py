"""The accept loop, one thread per connection, and the routing (by ``methods.METHODS``).

Services are imported on their first call, so an idle daemon holds only the HTTP layer.
"""

from __future__ import annotations

import os

from ._codec import b64decode, dumps, loads
from ._connect import error_body
from ._errors import RpcError, http_status
from ._http import Closed, Conn, HttpError, read_request
from ._rpc import serve_call
from ._sync import start_thread
from ._users import act_as
from .methods import FILESYSTEM, METHODS, PROCESS, user_refusal

__all__ = ["Server"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _socket import socket
    from collections.abc import Callable

    from ._http import Request
    from ._rpc import Handler

_JSON = [("Content-Type", "application/json")]


def _handler(module: str, function: str) -> Handler:
    package = __name__.rpartition(".")[0]
    mod = __import__(f"{package}.{module}", fromlist=[function])
    handler: Handler = getattr(mod, function)
    return handler


class Server:
    def __init__(self, listener: socket, user: str, users: tuple[str, ...] = ()) -> None:
        """``user``: the default one; ``users``: every one served (default: ``user``)."""
        self.listener = listener
        self.user = user
        self.users = users or (user,)

    def serve_forever(self) -> None:
        from _socket import socket as Socket

        while True:
            try:
                fd, _ = self.listener._accept()  # type: ignore[attr-defined]
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno in (103, 24, 23, 105, 12):  # ECONNABORTED EMFILE ENFILE ENOBUFS ENOMEM
                    continue
                raise
            start_thread(self._connection_thread(Socket(fileno=fd)))

    def _connection_thread(self, sock: socket) -> Callable[[], None]:
        return lambda: self._connection(sock)

    def _connection(self, sock: socket) -> None:
        conn = Conn(sock)
        try:
            act_as(self.user)  # until a request names its user: never root by default
            while True:
                try:
                    request = read_request(conn)
                except HttpError as err:
                    body = dumps({"code": err.status, "message": err.message}).encode()
                    conn.close_after = True
                    conn.respond(err.status, _JSON, body)
                    return
                self._dispatch(request, conn)
                conn.finish_body()
                if conn.close_after:
                    return
        except Closed:
            return
        except Exception:  # top of a connection thread: drop the connection
            return
        finally:
            sock.close()

    def own_port(self) -> int | None:
        """The TCP port the daemon listens on (a Pod's), None on a unix socket."""
        address = self.listener.getsockname()
        return address[1] if isinstance(address, tuple) else None

    def check_user(self, request: Request) -> None:
        """Refuse any user but those served (header or ``username`` query); this thread
        then acts as the one named (the default user when none is)."""
        user = request.query.get("username") or None
        auth = request.headers.get("authorization", "")
        if auth[:6].lower() == "basic ":
            try:
                decoded = b64decode(auth[6:].strip(), "authorization").decode("utf-8")
            except (RpcError, UnicodeDecodeError):
                raise RpcError("unauthenticated", "the authorization header is malformed") from None
            user = decoded.partition(":")[0] or user
        refusal = user_refusal(user, self.users, inside=True)
        if refusal is not None:
            raise RpcError("permission_denied", refusal)
        try:
            act_as(user or self.user)
        except OSError as exc:
            raise RpcError("internal", str(exc)) from None

    def _init(self, request: Request, conn: Conn) -> None:
        """``POST /init {"envVars": {...}}``: the environment every later process starts
        with (the host binds a pooled sandbox to its claimer this way, as E2B's orchestrator
        does with envd's /init)."""
        raw = request.body.read_all(1 << 20)
        try:
            body = loads(raw or b"{}")
            env = body.get("envVars") or {}
            if not isinstance(env, dict) or not all(
                isinstance(k, str)
                and isinstance(v, str)
                and k
                and "=" not in k
                and "\0" not in k + v
                for k, v in env.items()
            ):
                raise ValueError("envVars must map names to strings")
        except (ValueError, AttributeError) as exc:
            conn.respond(400, _JSON, dumps({"code": 400, "message": str(exc)}).encode())
            return
        os.environ.update(env)
        conn.respond(204, [])

    def _dispatch(self, request: Request, conn: Conn) -> None:
        path = request.path
        if path == "/health" and request.method in ("GET", "HEAD"):
            conn.respond(204, [])
            return
        if path == "/files":
            from . import _filehttp

            _filehttp.serve(self, request, conn)
            return
        if path == "/files/archive":
            from . import _filehttp

            _filehttp.serve_archive(self, request, conn)
            return
        if path.startswith("/ports/"):
            from . import _tunnel

            _tunnel.serve(request, conn, self.own_port())
            return
        if path == "/group/accept":
            from . import _tunnel

            _tunnel.serve_group(request, conn)
            return
        if path == "/init" and request.method == "POST":
            self._init(request, conn)
            return
        if path in ("/execute", "/contexts") or path.startswith("/contexts/"):
            from . import _code

            self.check_user(request)
            _code.serve(request, conn)
            return
        if path.startswith((f"/{PROCESS}/", f"/{FILESYSTEM}/")):
            route = METHODS.get(path[1:])
            if request.method != "POST" or route is None:
                err = (
                    RpcError("unimplemented", f"{path[1:]} is not implemented by this sandbox")
                    if route is None
                    else RpcError("unimplemented", "Connect calls use POST")
                )
                conn.respond(http_status(err.code), _JSON, error_body(err))
                return
            kind, _, module, function = route
            serve_call(request, conn, kind, _handler(module, function), self.check_user)
            return
        body = dumps({"code": 404, "message": f"no route for {request.method} {path}"})
        conn.respond(404, _JSON, body.encode())
