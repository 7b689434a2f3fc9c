"""``Link``: one sandbox's HTTP connection to the server, and the calls every part makes.

REST calls on ``/v1/sandboxes/{id}``, unary and streaming RPCs passed through to the
sandbox's daemon, and raw ``/files`` transfers. Transport failures become
``ServerUnreachable``; error answers become typed exceptions (``_connect``).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import httpx

from ringfence.client import _base
from ringfence.client._connect import (
    MAX_MESSAGE,
    NOT_FOUND_BY_SERVICE,
    ORIGIN_HEADER,
    Decoder,
    envelope,
    error_from_answer,
)
from ringfence.client._errors import FileNotFound
from ringfence.errors import NotFound, RingfenceError, SandboxError, SandboxNotFound

__all__ = ["KEEPALIVE_SECONDS", "Link", "RpcStream", "http_client"]

# The daemon sends a keepalive this often on an idle stream; a stream silent for three
# intervals is broken.
KEEPALIVE_SECONDS = 20
_STREAM_TIMEOUT = httpx.Timeout(30.0, read=3 * KEEPALIVE_SECONDS)
_REST_TIMEOUT = 120.0
# What a sandbox says is read with a cap: a hostile one could answer without end.
MAX_ANSWER = MAX_MESSAGE


def http_client(settings: _base.Settings) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=settings.url, headers=settings.headers(), timeout=settings.timeout,
        limits=httpx.Limits(max_keepalive_connections=8), verify=_base.tls_context(),
    )  # fmt: skip


class Link:
    """Requests about one sandbox over a shared ``httpx.AsyncClient``."""

    def __init__(self, settings: _base.Settings, sandbox_id: str, http: httpx.AsyncClient):
        self.settings = settings
        self.sandbox_id = sandbox_id
        self._http = http
        self.base = f"/v1/sandboxes/{quote(sandbox_id, safe='')}"

    @property
    def http(self) -> httpx.AsyncClient:
        """The client; a new one after ``aclose`` (a sandbox object stays usable)."""
        if self._http.is_closed:
            self._http = http_client(self.settings)
        return self._http

    async def aclose(self) -> None:
        await self._http.aclose()

    async def rest(
        self, method: str, suffix: str = "", json: Any = None, *, timeout: float = _REST_TIMEOUT
    ) -> Any:
        """A call on the sandbox itself; its JSON answer, within ``timeout`` seconds.

        Raises:
            SandboxNotFound, SandboxNotRunning, InvalidRequest, ServerUnreachable.
        """
        try:
            response = await self.http.request(
                method, self.base + suffix, json=json, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self.settings.url) from exc
        return _base.checked(response, SandboxNotFound)

    async def unary(self, service: str, method: str, message: dict[str, Any]) -> dict[str, Any]:
        """A unary RPC on the daemon; its answer message.

        Raises:
            FileNotFound or ProcessNotFound (by service), InvalidRequest, ResourceExhausted,
            SandboxNotFound (no such running sandbox), SandboxError, ServerUnreachable.
        """
        not_found = NOT_FOUND_BY_SERVICE.get(service, NotFound)
        request = self.http.build_request(
            "POST", f"{self.base}/rpc/{service}/{method}", json=message, timeout=_REST_TIMEOUT
        )
        response, body = await self._send_capped(request)
        if response.status_code != 200:
            raise error_from_answer(
                response.status_code, body, not_found, from_sandbox=_sandbox(response)
            )
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise SandboxError(f"{service}/{method}: the sandbox answered something not JSON")
        return answer

    async def stream(
        self, service: str, method: str, message: dict[str, Any], *, user: str | None = None
    ) -> RpcStream:
        """Open a server stream (``Start``, ``Connect``, ``WatchDir``) acting as ``user``
        inside (the sandbox's default when None); ``aclose`` it.

        Raises:
            As ``unary``, for an error answered before the first message.
        """
        not_found = NOT_FOUND_BY_SERVICE.get(service, NotFound)
        request = self.http.build_request(
            "POST",
            f"{self.base}/rpc/{service}/{method}",
            params={} if user is None else {"user": user},
            content=envelope(message),
            headers={
                "content-type": "application/connect+json",
                "keepalive-ping-interval": str(KEEPALIVE_SECONDS),
            },
            timeout=_STREAM_TIMEOUT,
        )
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self.settings.url) from exc
        if response.status_code != 200:
            try:
                body = await _read_capped(response)
            except httpx.HTTPError as exc:
                raise _base.translate(exc, self.settings.url) from exc
            finally:
                await response.aclose()
            raise error_from_answer(
                response.status_code, body, not_found, from_sandbox=_sandbox(response)
            )
        return RpcStream(response, Decoder(not_found), self.settings.url)

    @asynccontextmanager
    async def download(
        self, path: str, *, route: str = "/files"
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """The bytes of a file in the sandbox (``route="/files/archive"``: a directory as
        a tar stream), as they arrive.

        Raises:
            FileNotFound, InvalidRequest (a directory; for an archive, not one),
            SandboxNotFound, ServerUnreachable.
        """
        request = self.http.build_request(
            "GET", f"{self.base}{route}", params={"path": path}, timeout=_STREAM_TIMEOUT
        )
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self.settings.url) from exc
        try:
            if response.status_code != 200:
                raise error_from_answer(
                    response.status_code,
                    await _read_capped(response),
                    from_sandbox=_sandbox(response),
                )
            yield self._chunks(response)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self.settings.url) from exc
        finally:
            await response.aclose()

    async def _chunks(self, response: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self.settings.url) from exc

    async def upload(self, path: str, content: bytes | AsyncIterable[bytes]) -> Any:
        """Write a file in the sandbox from ``content`` (streamed when an iterable).

        Raises:
            ResourceExhausted (disk full), InvalidRequest, SandboxNotFound, ServerUnreachable.
        """
        request = self.http.build_request(
            "PUT",
            f"{self.base}/files",
            params={"path": path},
            content=content,
            headers={"content-type": "application/octet-stream"},
            timeout=httpx.Timeout(_REST_TIMEOUT, write=_REST_TIMEOUT),
        )
        response, body = await self._send_capped(request)
        if response.status_code != 200:
            raise error_from_answer(
                response.status_code, body, FileNotFound, from_sandbox=_sandbox(response)
            )
        try:
            return json.loads(body)
        except ValueError:
            return None

    async def _send_capped(self, request: httpx.Request) -> tuple[httpx.Response, bytes]:
        """Send ``request``; its answer and the answer's body, read up to MAX_ANSWER bytes.

        Raises:
            SandboxError: a longer body. ServerUnreachable.
        """
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self.settings.url) from exc
        try:
            return response, await _read_capped(response)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self.settings.url) from exc
        finally:
            await response.aclose()


class RpcStream:
    """The messages of one server stream, in order; keepalives are dropped."""

    def __init__(self, response: httpx.Response, decoder: Decoder, url: str) -> None:
        self._response = response
        self._decoder = decoder
        self._chunks = response.aiter_raw()
        self._pending: deque[dict[str, Any]] = deque()
        self._url = url
        self._error: RingfenceError | None = None

    async def next(self) -> dict[str, Any] | None:
        """The next message, or None once the stream has ended cleanly.

        Clean means with Connect's end-stream frame: the server passes a sandbox's answer
        through and, when the sandbox dies mid-answer, cuts it short.

        Raises:
            The mapped error of an end-stream frame that carries one; SandboxError: the body
            ended before that frame; ServerUnreachable.
        """
        while not self._pending:
            if self._error is not None:
                raise self._error
            if self._decoder.ended:
                return None
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                self._error = SandboxError("the sandbox ended the stream without finishing it")
                continue
            except httpx.HTTPError as exc:
                raise _base.translate(exc, self._url) from exc
            try:
                for message in self._decoder.feed(chunk):
                    if "keepalive" not in message and "keepalive" not in message.get("event", {}):
                        self._pending.append(message)
            except RingfenceError as exc:  # raised once the messages before it are read
                self._error = exc
        return self._pending.popleft()

    async def aclose(self) -> None:
        await self._response.aclose()


async def _read_capped(response: httpx.Response) -> bytes:
    """The whole body of a streamed answer; SandboxError past MAX_ANSWER bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER:
            raise SandboxError(f"the sandbox answered more than {MAX_ANSWER} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _sandbox(response: httpx.Response) -> bool:
    """Whether the answer is the sandbox daemon's, passed through by the server."""
    origin: str | None = response.headers.get(ORIGIN_HEADER)
    return origin == "sandbox"
