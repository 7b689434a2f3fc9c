"""A sandbox's streamed answer on E2B's door, ended as E2B ends it when the sandbox dies.

The native door cuts such an answer short and quietly; E2B's SDKs must instead learn that
it never finished, as they do from E2B, or a killed sandbox looks like code that ran and
printed nothing:

- a Connect stream (envd's ``process.Process/Start``, ``Connect``, ``WatchDir``) ends with
  an end-of-stream error ``unavailable`` "the connection to sandbox <id> ended before the
  stream completed", E2B's proxy's words: the SDK then probes the sandbox, finds it gone,
  and raises ``SandboxNotRunningException``;
- any other body (the code interpreter's ``/execute`` lines) is cut: its last chunk is
  never sent, so the connection closes mid-body, as E2B's does when its sandbox goes; the
  code interpreter SDK then finds the sandbox gone and raises its "The sandbox was killed
  while the request was in progress" ``TimeoutException``. A Connect stream that died
  mid-frame is cut too (an end frame after half a frame is garbage).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.types import Send

from ringfence.errors import SandboxNotRunning
from ringfence.service.sandbox_answers import Answer

__all__ = ["streamed_to_the_end"]

_HEADER = 5  # a Connect envelope: flags (1 byte), length (4 bytes, big-endian), payload
_END_STREAM = 0x02  # the flag of the envelope that ends a stream (its payload: JSON)


def streamed_to_the_end(answer: Answer, sandbox_id: str) -> StreamingResponse:
    """``answer`` as it is, its body streamed, ended as E2B's is should the sandbox die."""
    connect = answer.headers.get("content-type", "").startswith("application/connect+")
    return _Told(
        answer.chunks(),
        sandbox_id,
        connect=connect,
        status_code=answer.status,
        headers=answer.headers,
        background=BackgroundTask(answer.aclose),
    )


class _Told(StreamingResponse):
    def __init__(
        self, chunks: AsyncIterator[bytes], sandbox_id: str, *, connect: bool, **kwargs: object
    ) -> None:
        super().__init__(chunks, **kwargs)  # type: ignore[arg-type]
        self.sandbox_id = sandbox_id
        self.frames = _Frames() if connect else None

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})  # fmt: skip
        try:
            async for chunk in self.body_iterator:
                assert isinstance(chunk, bytes)
                if self.frames is not None:
                    self.frames.feed(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except SandboxNotRunning:
            if self.frames is None or not self.frames.at_boundary():
                return  # no last chunk: the connection closes mid-body
            message = (
                f"the connection to sandbox {self.sandbox_id} ended before the stream completed"
            )
            end = _envelope({"error": {"code": "unavailable", "message": message}})
            await send({"type": "http.response.body", "body": end, "more_body": False})
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _envelope(end: dict[str, object]) -> bytes:
    payload = json.dumps(end).encode()
    return bytes([_END_STREAM]) + len(payload).to_bytes(4, "big") + payload


class _Frames:
    """Where a Connect stream's envelopes begin and end, as its bytes pass."""

    def __init__(self) -> None:
        self.header = b""  # a header's first bytes, when a chunk ended inside one
        self.left = 0  # payload bytes still to come of the current envelope

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.left:
                taken = min(self.left, len(view))
                self.left -= taken
                view = view[taken:]
                continue
            need = _HEADER - len(self.header)
            self.header += bytes(view[:need])
            view = view[need:]
            if len(self.header) == _HEADER:
                self.left = int.from_bytes(self.header[1:], "big")
                self.header = b""

    def at_boundary(self) -> bool:
        return not self.header and not self.left
