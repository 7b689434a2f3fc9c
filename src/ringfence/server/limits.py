"""Request bodies are bounded before anything reads them: a client (authenticated or not)
cannot make the server buffer more than ``max_bytes``.

Routes that stream a body through without buffering it (file uploads into a sandbox, whose
disk limit bounds them) are named by ``streamed``, a pattern of paths."""

from __future__ import annotations

import asyncio
import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyBeforeRefusal", "BodyLimit"]


class BodyLimit:
    """ASGI middleware: 413 with a JSON error once a body exceeds ``max_bytes``."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, streamed: re.Pattern[str] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.streamed and self.streamed.fullmatch(scope["path"])):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0
        refused = False
        started = False

        async def counting_receive() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # Answer now and let the app see a client that went away: whatever it
                    # makes of that (frameworks turn body errors into a 400) is dropped.
                    refused = True
                    if not started:
                        await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counting_receive, tracking_send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": "too_large",
                    "message": f"the request body is larger than {self.max_bytes} bytes",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class BodyBeforeRefusal:
    """ASGI middleware: a refusal (a status of 400 or more) that an app gives before it read
    its request's body is held until the rest of the body has been read and dropped.

    A client may still be writing its body when a refusal (a bad key, a sandbox not found)
    comes back: E2B's Python SDK (hyper underneath) then drops the connection without
    reading the answer, and one that is still sending when the server closes a connection
    with unread bytes gets a reset instead. Read first, a refusal is read as the refusal.

    The reading is bounded: at most twice ``max_bytes`` (the body limit) of body in all,
    with what the app read, so that a body refused with 413 for being somewhat too large is
    still read and its refusal seen, and ``seconds``; a body past either, or one that
    declares more, is not read and the refusal goes out with ``Connection: close``. Before a
    connection has authenticated, the head deadline (``connections.py``) bounds its body's
    time, and the cap on connections before authentication the number of such bodies read at
    once.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, seconds: float = 5.0) -> None:
        self.app = app
        self.max_bytes = 2 * max_bytes  # what a refusal may read: twice the body limit
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        declared = headers.get(b"content-length")
        declared_bytes = int(declared) if declared is not None and declared.isdigit() else None
        seen = 0
        # Whether the body has been read whole (or the client went away); no body at all
        # when neither its length nor a transfer coding is given, or its length is 0.
        ended = declared_bytes == 0 or (declared is None and b"transfer-encoding" not in headers)
        # One reader at a time: Starlette's StreamingResponse listens for a disconnect while
        # the refusal waits, and the last body message must not be lost to either.
        reading = asyncio.Lock()

        async def read(*, draining: bool = False) -> Message | None:
            nonlocal seen, ended
            async with reading:
                if draining and ended:  # the app's own reading ended it meanwhile
                    return None
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    ended = ended or not message.get("more_body", False)
                else:
                    ended = True
            return message

        async def tracking_receive() -> Message:
            message = await read()
            assert message is not None
            return message

        async def drained() -> bool:
            """Read the rest of the body within the bounds: whether it was all read."""
            if declared_bytes is not None and declared_bytes > self.max_bytes:
                return False
            try:
                async with asyncio.timeout(self.seconds):
                    while not ended and seen <= self.max_bytes:
                        await read(draining=True)
            except TimeoutError:
                return False
            return seen <= self.max_bytes

        async def holding_send(message: Message) -> None:
            if (
                message["type"] == "http.response.start"
                and message["status"] >= 400
                and not ended
                and not await drained()
            ):
                closing = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": closing}
            await send(message)

        await self.app(scope, tracking_receive, holding_send)
