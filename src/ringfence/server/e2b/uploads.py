"""E2B's multipart file uploads, split into one streamed upload per file for the daemon.

The SDK's ``files.write`` and ``write_files`` post ``multipart/form-data`` with one ``file``
part per file, the part's filename being the target path (``?path=`` wins when given, for a
single file, as in envd). The sandbox daemon takes one ``application/octet-stream`` body per
file, so each part's bytes stream to its own daemon upload as they arrive: nothing is
buffered whole, and a file is bounded only by the sandbox's disk.

A signed upload URL signed one file at one path, so a body it admits (``single``) holds
exactly one part, written to the signed path whatever the part calls itself; the file is
committed only once the whole body is read, so a body with a second part (more files, or a
form field) is refused with nothing written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from ringfence.errors import InvalidRequest
from ringfence.service.daemon_client import FORWARDED_REQUEST_PREFIX
from ringfence.service.sandbox_answers import Answer
from ringfence.service.sandbox_calls import FileWriter

__all__ = ["Failed", "boundary_of", "upload_parts"]

_QUEUED_CHUNKS = 8  # backpressure: the client's body waits while the daemon is slow


class Failed(Exception):
    """A file was not written: the daemon's refusal is passed on as it is (``from_sandbox``),
    or the server's word on an answer it could not use."""

    def __init__(self, status: int, body: bytes, *, from_sandbox: bool = False) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.from_sandbox = from_sandbox


def boundary_of(content_type: str) -> bytes | None:
    """The multipart boundary, when ``content_type`` is ``multipart/form-data``."""
    kind, options = parse_options_header(content_type)
    if kind != b"multipart/form-data":
        return None
    boundary = options.get(b"boundary")
    if not boundary:
        raise InvalidRequest("multipart/form-data without a boundary")
    return boundary


@dataclass
class _Events:
    """What the parser's (synchronous) callbacks saw, for the async side to act on."""

    items: list[tuple[str, bytes]] = field(default_factory=list)
    header_name: bytearray = field(default_factory=bytearray)
    header_value: bytearray = field(default_factory=bytearray)

    def callbacks(self) -> dict[str, Callable[..., None]]:
        def data(kind: str) -> Callable[[bytes, int, int], None]:
            return lambda buf, start, end: self.items.append((kind, bytes(buf[start:end])))

        def mark(kind: str) -> Callable[[], None]:
            return lambda: self.items.append((kind, b""))

        def header_end() -> None:
            line = bytes(self.header_name) + b"\0" + bytes(self.header_value)
            self.items.append(("header", line))
            self.header_name.clear()
            self.header_value.clear()

        return {
            "on_part_begin": mark("begin"),
            "on_part_data": data("data"),
            "on_part_end": mark("end"),
            "on_header_field": lambda b, s, e: self.header_name.extend(b[s:e]),
            "on_header_value": lambda b, s, e: self.header_value.extend(b[s:e]),
            "on_header_end": header_end,
            "on_headers_finished": mark("headers"),
        }


async def upload_parts(
    writer: FileWriter,
    request: Request,
    boundary: bytes,
    path: str | None,
    *,
    single: bool = False,
) -> list[object]:
    """Upload each file part with ``writer`` (which puts each on the audit record before it
    is written); return the daemon's entries (``[{name, type, path}]``). With ``single``
    (a signed URL's upload), the body is one part written to ``path``, committed at the end.

    Raises:
        InvalidRequest: a part names no file, the body is not valid multipart, or (with
            ``single``) it holds more than one part.
        Failed: the daemon refused a file.
    """
    if single and path is None:
        raise InvalidRequest("a single-file upload needs its path")
    # X-Metadata-* of the request: every file it writes gets that metadata, as in envd
    metadata = {
        name: value
        for name, value in request.headers.items()
        if name.lower().startswith(FORWARDED_REQUEST_PREFIX)
    }
    events = _Events()
    parser = MultipartParser(boundary, events.callbacks())  # type: ignore[arg-type]
    written: list[object] = []
    headers: dict[str, str] = {}
    queue: asyncio.Queue[bytes | None] | None = None
    upload: asyncio.Task[Answer] | None = None
    parts = 0
    ended = False  # the single part's end was seen
    try:
        async for chunk in request.stream():
            try:
                parser.write(chunk)
            except ValueError as exc:  # python-multipart's parse errors derive from it
                raise InvalidRequest(f"the multipart body is malformed: {exc}") from None
            items, events.items = events.items, []
            for kind, value in items:
                if kind == "begin":
                    parts += 1
                    if single and parts > 1:
                        raise InvalidRequest(
                            "a signed upload URL writes the one file it was signed for: "
                            "the body holds more than one part"
                        )
                    headers = {}
                elif kind == "header":
                    name, _, text = value.partition(b"\0")
                    headers[name.decode("latin-1").lower()] = text.decode("utf-8", "replace")
                elif kind == "headers":
                    target = path or _filename(headers.get("content-disposition", ""))
                    if target is None:  # a plain form field: not a file
                        continue
                    queue = asyncio.Queue(_QUEUED_CHUNKS)
                    upload = asyncio.create_task(
                        _send(writer, target, queue, metadata, at_end=single)
                    )
                    path = None  # ?path= names the first file only
                elif kind == "data" and queue is not None and upload is not None:
                    await _put(queue, value, upload)
                elif kind == "end" and single:
                    ended = True  # committed once nothing follows
                elif kind == "end" and queue is not None and upload is not None:
                    await _put(queue, None, upload)
                    written.extend(await _entries(await upload))
                    queue, upload = None, None
        parser.finalize()
        if ended and queue is not None and upload is not None:
            await _put(queue, None, upload)
            written.extend(await _entries(await upload))
            queue, upload = None, None
    finally:
        if upload is not None:
            upload.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                response = await upload
                await response.aclose()
    if upload is not None or not written:
        raise InvalidRequest("the multipart body holds no complete file part")
    return written


async def _put(
    queue: asyncio.Queue[bytes | None], item: bytes | None, upload: asyncio.Task[Answer]
) -> None:
    """Queue ``item`` for the daemon, unless its upload ended first (it refused early)."""
    put = asyncio.ensure_future(queue.put(item))
    await asyncio.wait({put, upload}, return_when=asyncio.FIRST_COMPLETED)
    if put.done():
        return
    put.cancel()
    response = upload.result()  # its failure, if it failed
    await _entries(response)  # a refusal raises Failed
    raise Failed(502, b'{"code": 502, "message": "the sandbox answered before the file ended"}')


def _send(
    writer: FileWriter,
    target: str,
    queue: asyncio.Queue[bytes | None],
    metadata: dict[str, str],
    *,
    at_end: bool,
) -> Coroutine[None, None, Answer]:
    """The upload of ``target``, on the audit record from now on; its body is the queue's.

    The daemon writes in place as the bytes arrive (envd's way, which a watcher sees as the
    file's own writes); ``at_end`` has it write beside the file and commit once the body is
    whole, so that an upload cancelled before its end leaves the file as it was.
    """

    async def body() -> AsyncIterator[bytes]:
        while (chunk := await queue.get()) is not None:
            yield chunk

    headers = {"content-type": "application/octet-stream", **metadata}
    if at_end:
        headers["ringfence-commit"] = "at-end"
    return writer.write(target, headers, body())


async def _entries(answer: Answer) -> list[object]:
    body = await answer.aread()
    if answer.status != 200:
        raise Failed(answer.status, body, from_sandbox=True)
    try:
        entries = json.loads(body)
    except ValueError:
        raise Failed(502, b'{"code": 502, "message": "the sandbox answered garbage"}') from None
    return entries if isinstance(entries, list) else [entries]


def _filename(disposition: str) -> str | None:
    _, options = parse_options_header(disposition)
    name = options.get(b"filename")
    return name.decode("utf-8", "replace") if name else None
