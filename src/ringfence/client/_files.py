"""``sbx.files``: read, write, list and watch files in a sandbox.

Contents move as raw bytes, streamed both ways: a file-like object or an iterator given to
``write`` is sent chunk by chunk and never read whole into memory, and ``read_stream`` /
``download`` hand chunks over as they arrive. Relative paths start at /home/user. A write
replaces the file whole when it completes (an aborted upload leaves the old content), and
creates missing parent directories; so does ``download`` on the local side (a failed one
leaves no file, and an existing one as it was).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast, overload

from ringfence.client._errors import FileNotFound
from ringfence.client._link import Link, RpcStream
from ringfence.client._types import EntryInfo, FilesystemEvent, FileType
from ringfence.client._untar import MAX_ARCHIVE_BYTES, MAX_ARCHIVE_ENTRIES, extract_archive
from ringfence.errors import InvalidRequest, SandboxError
from ringfence.sandboxd.methods import FILESYSTEM

__all__ = ["CHUNK_SIZE", "AsyncFiles", "AsyncWatchHandle", "WriteData", "WriteInfo"]

CHUNK_SIZE = 256 * 1024

WriteData = (
    str | bytes | bytearray | memoryview | IO[bytes] | IO[str] | Iterable[bytes]
    | AsyncIterable[bytes]
)  # fmt: skip


@dataclass(frozen=True)
class WriteInfo:
    """The file a write created or replaced."""

    name: str
    path: str


async def _file_chunks(source: IO[Any]) -> AsyncIterator[bytes]:
    while True:
        chunk = await asyncio.to_thread(source.read, CHUNK_SIZE)
        if not chunk:
            return
        yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)


async def _iter_chunks(source: Iterable[Any]) -> AsyncIterator[bytes]:
    for chunk in source:
        yield _as_bytes(chunk)


async def _aiter_chunks(source: AsyncIterable[Any]) -> AsyncIterator[bytes]:
    async for chunk in source:
        yield _as_bytes(chunk)


def _as_bytes(chunk: object) -> bytes:
    if isinstance(chunk, str):
        return chunk.encode()
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        return bytes(chunk)
    raise InvalidRequest(f"files.write: an iterator must yield bytes, not {type(chunk).__name__}")


def body_of(data: WriteData) -> bytes | AsyncIterator[bytes]:
    """What to send for ``data``: small values as they are, everything else streamed."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, IO) or hasattr(data, "read"):
        return _file_chunks(cast("IO[Any]", data))
    if isinstance(data, AsyncIterable):
        return _aiter_chunks(data)
    if isinstance(data, Iterable):
        return _iter_chunks(data)
    raise InvalidRequest(f"files.write cannot send a {type(data).__name__}")


class AsyncFiles:
    """The filesystem of one sandbox."""

    def __init__(self, link: Link) -> None:
        self._link = link

    @overload
    async def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    async def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    async def read(self, path: str, format: Literal["text", "bytes"] = "text") -> str | bytes:
        """A whole file, as text (UTF-8) or bytes. For big files use ``read_stream``.

        Raises:
            FileNotFound; InvalidRequest: it is a directory.
        """
        parts = [chunk async for chunk in self.read_stream(path)]
        data = b"".join(parts)
        return data if format == "bytes" else data.decode("utf-8", errors="replace")

    async def read_stream(self, path: str) -> AsyncIterator[bytes]:
        """A file's bytes in chunks, as they arrive.

        Raises:
            FileNotFound (on the first iteration); InvalidRequest: it is a directory.
        """
        async with self._link.download(path) as chunks:
            async for chunk in chunks:
                yield chunk

    async def write(self, path: str, data: WriteData) -> WriteInfo:
        """Create or replace a file with ``data``: text (UTF-8), bytes, a binary or text
        file-like object, or a sync or async iterator of bytes (each streamed).

        Raises:
            ResourceExhausted: the sandbox's disk is full.
            InvalidRequest: ``path`` is a directory, or not writable.
        """
        answer = await self._link.upload(path, body_of(data))
        first = answer[0] if isinstance(answer, list) and answer else None
        if not isinstance(first, dict):
            raise SandboxError("the sandbox did not say which file it wrote")
        return WriteInfo(str(first.get("name", "")), str(first.get("path", "")))

    async def upload(self, local_path: str | Path, path: str) -> WriteInfo:
        """Copy a local file into the sandbox, streamed. Raises as ``write``, and OSError."""
        with open(local_path, "rb") as source:
            return await self.write(path, source)

    async def download(self, path: str, local_path: str | Path) -> Path:
        """Copy a file out of the sandbox, streamed, to ``local_path``: into a temporary file
        beside it, renamed into place once whole. A failure leaves no file behind, and a file
        already at ``local_path`` as it was. Raises as ``read``, and OSError."""
        target = Path(local_path)
        temp = target.with_name(f".{target.name}.download-{secrets.token_hex(6)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            with open(fd, "wb") as sink:
                async for chunk in self.read_stream(path):
                    await asyncio.to_thread(sink.write, chunk)
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        return target

    async def read_archive(self, path: str) -> AsyncIterator[bytes]:
        """A directory's tree as a tar stream (POSIX pax), in chunks as they arrive:
        names relative to it, symbolic links stored as links (never followed), fifos,
        sockets and devices left out. A stream cut short (the sandbox ended) lacks the tar
        end marker, which a tar reader reports.

        Raises:
            FileNotFound (on the first iteration); InvalidRequest: not a directory.
        """
        async with self._link.download(path, route="/files/archive") as chunks:
            async for chunk in chunks:
                yield chunk

    async def download_dir(
        self,
        path: str,
        local_dir: str | Path,
        *,
        max_bytes: int = MAX_ARCHIVE_BYTES,
        max_entries: int = MAX_ARCHIVE_ENTRIES,
    ) -> Path:
        """Copy a directory out of the sandbox into ``local_dir`` (made if missing; it
        must be empty), streamed: the archive goes to a temporary file beside it, then is
        extracted by Ringfence's own extractor, which treats it as hostile (never
        ``tarfile``'s filters): only files, directories and symbolic links; every write made
        relative to ``local_dir``'s descriptor, never through a link; no setuid bits,
        nothing group- or world-writable. A symbolic link that points outside (absolute, or
        up past ``local_dir``, resolved through the archive's own links) is left out
        (``read_archive`` has it). An archive with a hard link, a device, an absolute name,
        ``..``, a name given twice, an entry under a link, or more than ``max_bytes`` of
        files or ``max_entries`` entries is refused whole, leaving what was extracted
        before it.

        Raises:
            As ``read_archive``; OSError; SandboxError: the archive was refused, or is not
                a sound tar (cut short): the message says which entry and why.
        """
        target = Path(local_dir)
        target.mkdir(parents=True, exist_ok=True)
        if any(target.iterdir()):
            raise InvalidRequest(f"{target} is not empty")
        temp = target.with_name(f".{target.name}.archive-{secrets.token_hex(6)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with open(fd, "wb") as sink:
                async for chunk in self.read_archive(path):
                    await asyncio.to_thread(sink.write, chunk)
            try:
                await asyncio.to_thread(
                    extract_archive, temp, target, max_bytes=max_bytes, max_entries=max_entries
                )
            except SandboxError as exc:
                raise SandboxError(f"the sandbox's archive of {path} was refused: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        return target

    async def list(self, path: str, depth: int = 1) -> list[EntryInfo]:
        """The entries under a directory, ``depth`` levels deep (1: its children).

        Raises:
            FileNotFound; InvalidRequest: not a directory, or depth < 1.
        """
        if depth < 1:
            raise InvalidRequest("depth must be at least 1")
        answer = await self._link.unary(FILESYSTEM, "ListDir", {"path": path, "depth": depth})
        return [EntryInfo.from_message(e) for e in answer.get("entries") or []]

    async def exists(self, path: str) -> bool:
        try:
            await self.get_info(path)
        except FileNotFound:
            return False
        return True

    async def get_info(self, path: str) -> EntryInfo:
        """Raises ``FileNotFound``."""
        answer = await self._link.unary(FILESYSTEM, "Stat", {"path": path})
        return EntryInfo.from_message(answer.get("entry") or {})

    async def make_dir(self, path: str) -> bool:
        """Create a directory and its parents; False if it already existed.

        Raises:
            InvalidRequest: a file is in the way.
        """
        try:
            await self._link.unary(FILESYSTEM, "MakeDir", {"path": path})
        except InvalidRequest:
            if (await self.get_info(path)).type is FileType.DIRECTORY:
                return False
            raise
        return True

    async def remove(self, path: str) -> None:
        """Remove a file, or a directory with everything in it; nothing at ``path`` is
        nothing to do (as E2B's envd: cleanup code calls it without looking first)."""
        await self._link.unary(FILESYSTEM, "Remove", {"path": path})

    async def rename(self, old_path: str, new_path: str) -> EntryInfo:
        """Move a file or directory (replacing a file at ``new_path``).

        Raises:
            FileNotFound: nothing at ``old_path``.
        """
        message = {"source": old_path, "destination": new_path}
        answer = await self._link.unary(FILESYSTEM, "Move", message)
        return EntryInfo.from_message(answer.get("entry") or {})

    async def watch_dir(self, path: str, *, recursive: bool = False) -> AsyncWatchHandle:
        """Watch a directory for changes; returns once the watch is in place.

        Raises:
            FileNotFound; InvalidRequest: not a directory.
        """
        stream = await self._link.stream(
            FILESYSTEM, "WatchDir", {"path": path, "recursive": recursive}
        )
        return await AsyncWatchHandle.started(stream)


class AsyncWatchHandle:
    """Changes under a watched directory: ``async for event in handle`` (until ``stop()``),
    or ``get_new_events()`` for what arrived since the last call. Both raise
    ``SandboxError`` once the sandbox has broken the watch off (for instance by ending)."""

    def __init__(self, stream: RpcStream) -> None:
        self._stream = stream
        self._events: asyncio.Queue[FilesystemEvent | BaseException | None] = asyncio.Queue()
        self._reader = asyncio.ensure_future(self._read())
        self._stopped = False

    @classmethod
    async def started(cls, stream: RpcStream) -> AsyncWatchHandle:
        try:
            first = await stream.next()
            if first is None or "start" not in first:
                raise SandboxError("the sandbox's watch did not begin with a start event")
        except BaseException:
            await stream.aclose()
            raise
        return cls(stream)

    async def _read(self) -> None:
        try:
            while (message := await self._stream.next()) is not None:
                event = FilesystemEvent.from_message(message.get("filesystem") or {})
                if event is not None:
                    self._events.put_nowait(event)
            self._events.put_nowait(None)
        except asyncio.CancelledError:
            self._events.put_nowait(None)
        except Exception as exc:  # boundary: handed to the reader of the events
            self._events.put_nowait(exc)
        finally:
            await self._stream.aclose()

    def __aiter__(self) -> AsyncWatchHandle:
        return self

    async def __anext__(self) -> FilesystemEvent:
        item = await self._events.get()
        if item is None:
            self._events.put_nowait(None)  # every later read ends too
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._events.put_nowait(item)  # every later read raises too
            raise item
        return item

    def get_new_events(self) -> list[FilesystemEvent]:
        """The events that arrived since the last call (never waits)."""
        events = []
        while not self._events.empty():
            item = self._events.get_nowait()
            if item is None:
                self._events.put_nowait(None)
                break
            if isinstance(item, BaseException):
                self._events.put_nowait(item)
                raise item
            events.append(item)
        return events

    async def stop(self) -> None:
        """End the watch (iteration ends after the events already received)."""
        if not self._stopped:
            self._stopped = True
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
