"""Connect RPC calls over one HTTP request: parsing the request, answering, streaming.

Handlers receive a ``Call``. Unary handlers return the response message; stream handlers
write messages with ``Call.send`` and return; client-stream handlers pull messages with
``Call.receive``. A raised ``RpcError`` becomes a Connect error in the right shape for the
call's kind.
"""

from __future__ import annotations

from ._codec import dumps, loads
from ._connect import COMPRESSED, END_STREAM, end_envelope, envelope, error_body
from ._errors import RpcError, http_status, invalid
from ._http import Closed
from .methods import CLIENT_STREAM, SERVER_STREAM, UNARY

__all__ = ["MAX_MESSAGE", "Call", "serve_call"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ._codec import Msg
    from ._http import Conn, Request

    Handler = Callable[["Call"], "Msg | None"]

MAX_MESSAGE = 16 * 1024 * 1024
_KEEPALIVE_DEFAULT = 50.0


class Call:
    def __init__(self, request: Request, conn: Conn, kind: str, message: Msg | None) -> None:
        self.request = request
        self.conn = conn
        self.kind = kind
        self.message: Msg = message or {}
        self.started = False

    @property
    def timeout(self) -> float | None:
        """The client's deadline for the call (``connect-timeout-ms``), in seconds."""
        raw = self.request.headers.get("connect-timeout-ms", "")
        if raw.isdigit() and 0 < int(raw) < 10**12:
            return int(raw) / 1000
        return None

    @property
    def keepalive(self) -> float:
        raw = self.request.headers.get("keepalive-ping-interval", "")
        try:
            value = float(raw)
        except ValueError:
            return _KEEPALIVE_DEFAULT
        return value if 0.05 <= value <= 3600 else _KEEPALIVE_DEFAULT

    def send(self, message: Msg) -> None:
        self.send_raw(envelope(dumps(message).encode()))

    def send_raw(self, frame: bytes) -> None:
        if not self.started:
            self.conn.start_chunked(200, "application/connect+json")
            self.started = True
        self.conn.send_chunk(frame)

    def receive(self) -> Msg | None:
        """The next message of a client stream, or None at its end."""
        return read_envelope(self.request, allow_end=True)


def read_envelope(request: Request, *, allow_end: bool) -> Msg | None:
    head = request.body.read_exact(5)
    if head is None:
        if allow_end:
            return None
        raise invalid("the request stream ended before its message")
    flags = head[0]
    size = int.from_bytes(head[1:5], "big")
    if flags & COMPRESSED:
        raise invalid("compressed messages are not supported; send identity encoding")
    if size > MAX_MESSAGE:
        raise invalid(f"a message of {size} bytes is larger than the {MAX_MESSAGE} allowed")
    payload = request.body.read_exact(size)
    if payload is None:
        raise invalid("the request stream ends inside a message (truncated envelope)")
    if flags & END_STREAM:
        return None
    message = loads(payload)
    if not isinstance(message, dict):
        raise invalid("a request message must be a JSON object")
    return message


def serve_call(
    request: Request, conn: Conn, kind: str, handler: Handler, check: Callable[[Request], None]
) -> None:
    """Run ``handler`` for ``request`` and write its answer; raise Closed if the peer left.

    ``check`` runs first (the user check); its RpcError is answered like the handler's.
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    expected = "application/json" if kind == UNARY else "application/connect+json"
    call = Call(request, conn, kind, None)
    try:
        check(request)
        if content_type != expected:
            raise RpcError(
                "unimplemented" if "proto" in content_type else "invalid_argument",
                f"content-type must be {expected} (only the JSON codec is supported)",
            )
        if kind == UNARY:
            body = request.body.read_all(MAX_MESSAGE)
            if body is None:
                conn.close_after = True
                raise invalid(f"the request body is larger than {MAX_MESSAGE} bytes")
            message = loads(body) if body.strip() else {}
            if not isinstance(message, dict):
                raise invalid("the request body must be a JSON object")
            call.message = message
        elif kind == SERVER_STREAM:
            call.message = read_envelope(request, allow_end=False) or {}
            # The client ends the body after its one message, maybe in a later write: wait
            # for that end, so nothing of this request is left to look like a hangup.
            if request.body.read_all(0) is None:
                raise invalid("a server-stream request carries exactly one message")
        result = handler(call)
    except RpcError as err:
        _send_error(call, err)
        return
    except Closed:
        raise
    except Exception as exc:  # a handler bug must not kill the connection thread
        _send_error(call, RpcError("internal", f"{type(exc).__name__}: {exc}"))
        return
    if kind == UNARY:
        body = dumps(result or {}).encode()
        conn.respond(200, [("Content-Type", "application/json")], body)
    elif kind == CLIENT_STREAM:
        frames = envelope(dumps(result or {}).encode()) + end_envelope()
        conn.respond(200, [("Content-Type", "application/connect+json")], frames)
    else:
        call.send_raw(end_envelope())
        conn.end_chunked()


def _send_error(call: Call, err: RpcError) -> None:
    if call.kind == UNARY:
        headers = [("Content-Type", "application/json")]
        call.conn.respond(http_status(err.code), headers, error_body(err))
    elif call.kind == CLIENT_STREAM:
        call.conn.respond(200, [("Content-Type", "application/connect+json")], end_envelope(err))
    else:
        call.send_raw(end_envelope(err))
        call.conn.end_chunked()
