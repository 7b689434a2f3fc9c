"""A lean HTTP/1.1 client for the benchmarks: h11 over one kept-alive asyncio connection.

httpx's async client adds about 3 ms to every request on these machines (a GET of
/v1/health: 3.5 ms through httpx, 0.6 ms over a raw socket), more than half of the 5 ms
command goal. The server's latency is measured with this client; the httpx figures are
printed beside it as what the SDK's client adds.

It offers the few methods of ``httpx.AsyncClient`` the benchmarks call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import h11

__all__ = ["LeanClient", "LeanResponse"]


class LeanResponse:
    def __init__(self, client: LeanClient, head: h11.Response) -> None:
        self.status_code = head.status_code
        self._client = client
        self._body: bytes | None = None

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        while True:
            event = await self._client._next_event()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._client._cycle()
                return
            else:
                raise ConnectionError(f"the server broke off the answer: {event!r}")

    async def aread(self) -> bytes:
        if self._body is None:
            self._body = b"".join([chunk async for chunk in self.aiter_bytes()])
        return self._body

    def json(self) -> Any:
        assert self._body is not None, "aread() first"
        return json.loads(self._body)

    @property
    def text(self) -> str:
        return (self._body or b"").decode(errors="replace")


class LeanClient:
    """One connection, one request at a time (the benchmarks run sequentially)."""

    def __init__(
        self, base_url: str, headers: Mapping[str, str], *, uds: str | None = None
    ) -> None:
        url = urlsplit(base_url)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 80
        self._uds = uds  # a unix socket to connect to instead (a sandbox daemon's)
        self._headers = [(k, v) for k, v in headers.items()]
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._protocol = h11.Connection(h11.CLIENT)

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()

    async def get(self, path: str) -> LeanResponse:
        return await self._whole("GET", path, b"", {})

    async def delete(self, path: str) -> LeanResponse:
        return await self._whole("DELETE", path, b"", {})

    async def post(
        self, path: str, json: Any = None, content: bytes = b"", headers: Mapping[str, str] = {}
    ) -> LeanResponse:
        if json is not None:
            content = _dumps(json)
            headers = {"content-type": "application/json", **headers}
        return await self._whole("POST", path, content, headers)

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, path: str, headers: Mapping[str, str], content: bytes
    ) -> AsyncIterator[LeanResponse]:
        response = await self._send(method, path, content, headers)
        try:
            yield response
        finally:
            if self._protocol.their_state is not h11.DONE:
                await response.aread()  # keep the connection usable

    async def _whole(
        self, method: str, path: str, content: bytes, headers: Mapping[str, str]
    ) -> LeanResponse:
        response = await self._send(method, path, content, headers)
        await response.aread()
        return response

    async def _send(
        self, method: str, path: str, content: bytes, headers: Mapping[str, str]
    ) -> LeanResponse:
        if self._writer is None and self._uds is not None:
            self._reader, self._writer = await asyncio.open_unix_connection(self._uds)
        elif self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        all_headers = [
            ("host", f"{self._host}:{self._port}"),
            *self._headers,
            *headers.items(),
            ("content-length", str(len(content))),
        ]
        data = self._protocol.send(h11.Request(method=method, target=path, headers=all_headers))
        data += self._protocol.send(h11.Data(data=content)) if content else b""
        data += self._protocol.send(h11.EndOfMessage())
        assert self._writer is not None and data is not None
        self._writer.write(data)
        event = await self._next_event()
        if not isinstance(event, h11.Response):
            raise ConnectionError(f"no answer from the server: {event!r}")
        return LeanResponse(self, event)

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        assert self._reader is not None
        while True:
            event = self._protocol.next_event()
            if event is h11.NEED_DATA:
                self._protocol.receive_data(await self._reader.read(65536))
                continue
            return event  # type: ignore[return-value]

    def _cycle(self) -> None:
        if self._protocol.our_state is h11.DONE and self._protocol.their_state is h11.DONE:
            self._protocol.start_next_cycle()


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()
