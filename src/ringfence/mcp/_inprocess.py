"""An httpx transport that hands each request to an ASGI app in this process, streaming.

httpx's own ``ASGITransport`` buffers a whole answer before returning it, so a command's
output, which the API streams, would sit in memory until the command ended. This one
returns the answer once its head is sent and passes the body on as it comes, through a
small queue: the app waits while the reader does not read (back-pressure), and closing the
answer early tells the app the client went away (``http.disconnect``), and stops it if it
does not end by itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
from starlette.types import ASGIApp

__all__ = ["InProcessTransport"]

_QUEUE_CHUNKS = 8  # body chunks in flight between the app and the reader
_CLOSE_GRACE = 5.0  # seconds an app has to end once its client went away


class InProcessTransport(httpx.AsyncBaseTransport):
    """Requests to ``app``, as if from ``client`` (the address of the caller they act for)."""

    def __init__(self, app: ASGIApp, client: tuple[str, int] | None = None) -> None:
        self._app = app
        self._client = client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = _Exchange(self._app, _scope(request, self._client), request)
        return await exchange.start()


def _scope(request: httpx.Request, client: tuple[str, int] | None) -> dict[str, Any]:
    url = request.url
    port = url.port or (443 if url.scheme == "https" else 80)
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": url.scheme,
        "path": url.path,
        "raw_path": url.raw_path.split(b"?")[0],
        "query_string": url.query,
        "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "server": (url.host, port),
        "client": client,
        "state": {},
    }


class _Exchange:
    """One request: the app runs in a task of its own; its answer comes through a queue."""

    def __init__(self, app: ASGIApp, scope: dict[str, Any], request: httpx.Request) -> None:
        self._app = app
        self._scope = scope
        self._request = request
        assert isinstance(request.stream, httpx.AsyncByteStream)
        self._body = request.stream.__aiter__()
        self._body_done = False
        self._head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = (
            asyncio.get_running_loop().create_future()
        )
        # Chunks of the body; None ends it, an exception breaks it off.
        self._chunks: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(_QUEUE_CHUNKS)
        self._complete = False
        self._gone = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> httpx.Response:
        self._task = asyncio.create_task(self._run())
        try:
            status, headers = await self._head
        except BaseException:
            await self.close()
            raise
        return httpx.Response(status, headers=headers, stream=_Body(self), request=self._request)

    async def _run(self) -> None:
        try:
            await self._app(self._scope, self._receive, self._send)
        except Exception as exc:
            # Starlette answers 500 for an unexpected error, then raises it again for the
            # server to log (the app has logged it already): a whole answer stands.
            if self._complete:
                return
            failure = httpx.RemoteProtocolError(f"the server broke off its answer: {exc!r}")
            if not self._head.done():
                self._head.set_exception(failure)
            else:
                await self._chunks.put(failure)
            return
        if not self._head.done():
            self._head.set_exception(httpx.RemoteProtocolError("the server sent no answer"))
        elif not self._complete:
            self._complete = True
            await self._chunks.put(None)

    async def _receive(self) -> MutableMapping[str, Any]:
        if not self._body_done:
            try:
                chunk = await self._body.__anext__()
            except StopAsyncIteration:
                self._body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            return {"type": "http.request", "body": bytes(chunk), "more_body": True}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        if self._gone.is_set():
            return  # as an ASGI server does: the app learns it from http.disconnect
        if message["type"] == "http.response.start":
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            self._head.set_result((int(message["status"]), headers))
        elif message["type"] == "http.response.body":
            body = bytes(message.get("body", b""))
            if body and self._request.method != "HEAD":
                await self._chunks.put(body)
            if not message.get("more_body", False) and not self._complete:
                self._complete = True
                await self._chunks.put(None)

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._chunks.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                return
            yield item

    async def close(self) -> None:
        """The reader is done: tell the app, and wait for it to end as it does when a real
        client goes away (a streaming answer then closes what it streamed from, so a
        sandbox's cell learns nobody reads it); stop it if it has not ended in a while."""
        self._gone.set()
        task = self._task
        if task is None or task.done():
            return
        while not self._chunks.empty():  # a send waiting for room goes on
            self._chunks.get_nowait()
        try:
            await asyncio.wait({task}, timeout=_CLOSE_GRACE)
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class _Body(httpx.AsyncByteStream):
    def __init__(self, exchange: _Exchange) -> None:
        self._exchange = exchange

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._exchange.chunks():
            yield chunk

    async def aclose(self) -> None:
        await self._exchange.close()
