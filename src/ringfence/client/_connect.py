"""Connect RPC with the JSON codec, as the sandbox daemon speaks it: envelopes and errors.

Pure helpers: framing one request message, cutting a response body into messages as bytes
arrive, and turning an error answer into a typed exception. Every error answer has the
native API's shape, ``{"error": {"code", "message"}}``: the Ringfence server's own (no such
sandbox, not running), or the daemon's refusal as the server translated it (marked
``Ringfence-Origin: sandbox``: ``not_found`` is then the file, process or context, and no
code of the server's own is believed). Inside a stream, the end frame carries a Connect
error (``{"code": "not_found", "message"}``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

from ringfence.client._errors import FileNotFound, ProcessNotFound, ResourceExhausted
from ringfence.errors import (
    InvalidRequest,
    NotFound,
    RingfenceError,
    SandboxError,
    SandboxNotFound,
    error_for,
)
from ringfence.sandboxd.methods import FILESYSTEM, PROCESS

__all__ = [
    "END_STREAM",
    "MAX_MESSAGE",
    "ORIGIN_HEADER",
    "Decoder",
    "envelope",
    "error_from_answer",
    "error_from_connect",
]

END_STREAM = 0x02
_COMPRESSED = 0x01
_HEAD = struct.Struct(">BI")
MAX_MESSAGE = 16 * 1024 * 1024

_INVALID = frozenset(
    {"invalid_argument", "already_exists", "permission_denied", "failed_precondition",
     "out_of_range", "unimplemented"}
)  # fmt: skip
# /files answers with HTTP statuses, as E2B's envd does.
_FILE_STATUS_CODES = {
    400: "invalid_argument", 403: "permission_denied", 404: "not_found", 409: "already_exists",
    415: "invalid_argument", 507: "resource_exhausted",
}  # fmt: skip


def envelope(message: dict[str, Any]) -> bytes:
    """One message of a streaming request."""
    payload = json.dumps(message).encode()
    return _HEAD.pack(0, len(payload)) + payload


class Decoder:
    """Cuts a stream body into messages. ``feed`` bytes as they arrive; it yields each
    complete message. The end-stream frame raises its error, if it has one.

    Raises:
        SandboxError: a malformed frame.
    """

    def __init__(self, not_found: type[NotFound]) -> None:
        self._buffer = bytearray()
        self._not_found = not_found
        self.ended = False

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        self._buffer += data
        while len(self._buffer) >= _HEAD.size and not self.ended:
            flags, size = _HEAD.unpack_from(self._buffer)
            if size > MAX_MESSAGE or flags & _COMPRESSED:
                raise SandboxError("the sandbox sent a malformed stream frame")
            if len(self._buffer) < _HEAD.size + size:
                return
            payload = bytes(self._buffer[_HEAD.size : _HEAD.size + size])
            del self._buffer[: _HEAD.size + size]
            message = _parse(payload)
            if flags & END_STREAM:
                self.ended = True
                error = message.get("error")
                if isinstance(error, dict):
                    raise error_from_connect(error, self._not_found)
                return
            yield message


def _parse(payload: bytes) -> dict[str, Any]:
    try:
        message = json.loads(payload)
    except ValueError:
        raise SandboxError("the sandbox sent a frame that is not JSON") from None
    if not isinstance(message, dict):
        raise SandboxError("the sandbox sent a frame that is not a JSON object")
    return message


def error_from_connect(error: dict[str, Any], not_found: type[NotFound]) -> RingfenceError:
    """The exception for a Connect error ``{"code", "message"}`` from the daemon."""
    code, message = error.get("code"), str(error.get("message", ""))
    if isinstance(code, int):
        code = _FILE_STATUS_CODES.get(code, "unknown")
    if code == "not_found":
        return not_found(message)
    if code in _INVALID:
        return InvalidRequest(message)
    if code == "resource_exhausted":
        return ResourceExhausted(message)
    return SandboxError(f"{message} ({code})" if message else f"the sandbox answered {code}")


# The server marks every answer it passes through from a sandbox's daemon: what the daemon
# says is the sandboxed code's word, which must never pass for the server's own errors.
ORIGIN_HEADER = "ringfence-origin"


def error_from_answer(
    status: int, body: bytes, not_found: type[NotFound] = FileNotFound, *, from_sandbox: bool
) -> RingfenceError:
    """The exception for a non-2xx answer to a sandbox call (server or daemon)."""
    by_code: dict[str, type[RingfenceError]] = {  # what a sandbox may say
        NotFound.code: not_found,
        InvalidRequest.code: InvalidRequest,
        ResourceExhausted.code: ResourceExhausted,
    }
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            code, message = error["code"], str(error.get("message", ""))
            if from_sandbox:
                return by_code.get(code, SandboxError)(message)
            return SandboxNotFound(message) if code == NotFound.code else error_for(code, message)
        if isinstance(parsed.get("code"), (str, int)):  # a daemon's own shape (older servers)
            return error_from_connect(parsed, not_found)
    if status in _FILE_STATUS_CODES:
        return error_from_connect({"code": status}, not_found)
    return SandboxError(f"unexpected answer from the sandbox: HTTP {status}")


NOT_FOUND_BY_SERVICE: dict[str, type[NotFound]] = {
    PROCESS: ProcessNotFound,
    FILESYSTEM: FileNotFound,
}
