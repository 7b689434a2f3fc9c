"""Connect RPC framing: errors with their HTTP statuses, and envelopes for streams.

A stream body is a sequence of envelopes, each ``struct.pack(">BI", flags, len(payload))``
followed by a JSON payload. Flag 0x02 marks the end-stream frame, whose payload is ``{}`` or
``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from ._codec import dumps
from ._errors import RpcError

__all__ = ["END_STREAM", "end_envelope", "envelope", "error_body"]

END_STREAM = 0x02
COMPRESSED = 0x01


def error_body(err: RpcError) -> bytes:
    return dumps({"code": err.code, "message": err.message}).encode()


def envelope(payload: bytes, flags: int = 0) -> bytes:
    n = len(payload)
    return bytes((flags, n >> 24 & 0xFF, n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF)) + payload


def end_envelope(err: RpcError | None = None) -> bytes:
    if err is None:
        return envelope(b"{}", END_STREAM)
    body = dumps({"error": {"code": err.code, "message": err.message}})
    return envelope(body.encode(), END_STREAM)
