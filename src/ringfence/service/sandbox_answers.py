"""A sandbox daemon's answer as the server passes it on, whichever door asked.

The daemon runs as the sandbox's user: what it answers may be anything, and it is served
from the server's origin (where the approval console lives). So every answer goes out
inert (no browser runs or sniffs it), typed only as the daemon's own protocols or as
opaque bytes, and marked ``Ringfence-Origin: sandbox`` so that no client takes the
sandbox's word for the server's own. A refusal the native API answers in its own error
shape is mapped here too (``sandbox_error``): the daemon picks among a few documented
errors, never a status or code of the server's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import NamedTuple

from ringfence.errors import InvalidRequest, NotFound, SandboxError, SandboxNotRunning
from ringfence.service.daemon_client import FORWARDED_RESPONSE_HEADERS, DaemonResponse

_log = logging.getLogger(__name__)

__all__ = [
    "ORIGIN_HEADER",
    "PASSED_STATUSES",
    "REFUSAL_HEADERS",
    "Answer",
    "Refusal",
    "answer_headers",
    "clip",
    "sandbox_error",
]

ORIGIN_HEADER = "Ringfence-Origin"
# What the native API passes on of the daemon's statuses; anything else is a refusal.
PASSED_STATUSES = frozenset({200, 204})
# The daemon's answers: its protocols' types pass on, any other becomes opaque bytes.
_PASSED_TYPES = frozenset(
    {"application/json", "application/connect+json", "application/octet-stream"}
)
# On every answer from a sandbox: no browser sniffs it into a page or runs it as one.
_INERT = {"x-content-type-options": "nosniff", "content-security-policy": "sandbox"}
# The headers of a refusal answered in the native API's error shape.
REFUSAL_HEADERS: Mapping[str, str] = {**_INERT, ORIGIN_HEADER: "sandbox"}
_CLIPPED_CHARS = 2048  # of a command line, path or message kept (audit records, refusals)
_REFUSAL_BYTES = 64 * 1024  # of a refusal's body read (a longer one is not the daemon's)
# The daemon's error codes (Connect's) as the native API answers them. The daemon runs as
# the sandbox's user, so it picks among these only: never a status or code of the server's
# own (a key, a tenant, a replica), and nothing undocumented.
_SANDBOX_CODES: dict[str, tuple[int, str]] = {
    "not_found": (404, NotFound.code),
    "resource_exhausted": (429, "resource_exhausted"),  # 507 when it says so: a full disk
    **dict.fromkeys(
        ("invalid_argument", "failed_precondition", "out_of_range", "already_exists",
         "permission_denied", "unimplemented", "unauthenticated"),
        (400, InvalidRequest.code),
    ),
}  # fmt: skip
# envd's /files answers carry their HTTP status as the code.
_FILE_CODES = {
    400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
    404: "not_found", 409: "already_exists", 415: "invalid_argument", 507: "resource_exhausted",
}  # fmt: skip


def clip(text: str) -> str:
    """``text`` cut to what a record or a refusal keeps of it (2048 characters)."""
    return text if len(text) <= _CLIPPED_CHARS else text[:_CLIPPED_CHARS] + "…"


def answer_headers(
    upstream: Iterable[tuple[str, str]], content_length: str | None, *, download: bool
) -> dict[str, str]:
    """The headers of a daemon's answer as the server passes it on: ``nosniff`` and a CSP
    ``sandbox``, a type outside the daemon's own protocols made opaque bytes, a downloaded
    file always an attachment of opaque bytes, and ``Ringfence-Origin: sandbox``."""
    headers = {
        name.lower(): value
        for name, value in upstream
        if name.lower() in FORWARDED_RESPONSE_HEADERS
    }
    kind = headers.get("content-type", "").partition(";")[0].strip().lower()
    if download or kind not in _PASSED_TYPES:
        headers["content-type"] = "application/octet-stream"
    if download:
        headers["content-disposition"] = "attachment"
    if content_length is not None:
        headers["content-length"] = content_length
    headers.update(_INERT)
    # What the daemon says is the sandboxed code's word: mark it, so that no client takes a
    # daemon's {"error": {"code": "unauthenticated"}} for the server's own.
    headers[ORIGIN_HEADER] = "sandbox"
    return headers


def _at_most(content_length: str, limit: int) -> bool:
    try:
        return int(content_length) <= limit
    except ValueError:
        return False


class Refusal(NamedTuple):
    """A daemon's refusal as the native API answers it: ``{"error": {code, message}}``
    with ``status`` and ``REFUSAL_HEADERS``."""

    status: int
    code: str
    message: str


def sandbox_error(status: int, body: bytes) -> Refusal:
    """The native API's answer to a daemon's refusal (its ``status`` and ``body``: a Connect
    error ``{"code": "not_found", "message"}`` or envd's ``{"code": 404, "message"}``).
    What the daemon says that is not one of its known errors is a 502 ``sandbox_error``."""
    try:
        parsed = json.loads(body)
    except ValueError:  # UnicodeDecodeError too
        parsed = None
    code: object = parsed.get("code") if isinstance(parsed, dict) else None
    said = parsed.get("message") if isinstance(parsed, dict) else None
    message = clip(said) if isinstance(said, str) else ""
    if isinstance(code, int) and not isinstance(code, bool):
        code = _FILE_CODES.get(code)
    known = _SANDBOX_CODES.get(code) if isinstance(code, str) and status >= 400 else None
    if known is None:
        detail = f": {message}" if message else ""
        return Refusal(502, SandboxError.code, f"the sandbox answered HTTP {status}{detail}")
    answered, ours = known
    if code == "resource_exhausted" and status == 507:
        answered = 507
    return Refusal(answered, ours, message or f"the sandbox answered {code}")


class Answer:
    """A daemon's answer on its way to the caller: ``status``, the ``headers`` it goes out
    with (``answer_headers``) and its body, streamed. Read the body once (``stream`` or
    ``aread``) or read its ``refusal``; ``aclose`` in any case (a read to the end closes it
    too)."""

    def __init__(
        self, upstream: DaemonResponse, *, download: bool = False, max_bytes: int | None = None
    ) -> None:
        """``download``: the body is a file's bytes (an attachment). ``max_bytes``: the
        most of the body passed on; the rest is never read (the body ends there, as if the
        sandbox had ended: the daemon is the sandbox's word, and its size too)."""
        self.status = upstream.status_code
        length = upstream.content_length
        if max_bytes is not None and length is not None and not _at_most(length, max_bytes):
            length = None  # sent chunked, so that a cut body is still a sound HTTP answer
        self.headers = answer_headers(upstream.headers, length, download=download)
        self._upstream = upstream
        self._max_bytes = max_bytes
        self.cut = False  # the body was cut at max_bytes

    async def stream(self) -> AsyncIterator[bytes]:
        """The body as it comes; cut short (no error) if the sandbox ends mid-answer."""
        try:
            async for chunk in self.chunks():
                yield chunk
        except SandboxNotRunning:
            return

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes.

        Raises:
            SandboxNotRunning: the sandbox ended before the body did (a door that must tell
                its client so, as E2B's does, reads this rather than ``stream``).
        """
        left = self._max_bytes
        try:
            async for chunk in self._upstream.aiter_raw():
                if left is not None:
                    if len(chunk) > left:
                        self.cut = True
                        if left:
                            yield chunk[:left]
                        _log.warning("a sandbox's answer was cut at %d bytes", self._max_bytes)
                        return
                    left -= len(chunk)
                yield chunk
        finally:
            await self._upstream.aclose()

    async def aread(self) -> bytes:
        """The whole body.

        Raises:
            SandboxNotRunning: the sandbox ended before the body did.
        """
        return await self._upstream.aread()

    async def refusal(self) -> Refusal:
        """What the native API answers for this answer (one not in ``PASSED_STATUSES``);
        reads at most 64 KiB of the body, then closes it."""
        body = bytearray()
        try:
            async for chunk in self._upstream.aiter_raw():
                body += chunk
                if len(body) > _REFUSAL_BYTES:
                    break
        except SandboxNotRunning:
            pass  # what came is all there is
        finally:
            await self._upstream.aclose()
        return sandbox_error(self.status, bytes(body))

    async def aclose(self) -> None:
        await self._upstream.aclose()
