"""Tools for a sandbox's files: read, write, list."""

from __future__ import annotations

import base64
import binascii
import codecs
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Annotated, Literal, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import Field

from ringfence.client import EntryInfo, FileType
from ringfence.errors import InvalidRequest
from ringfence.mcp._connect import Connector, session, tool_error
from ringfence.mcp._registry import add_tool
from ringfence.mcp._sandbox_tools import SandboxId
from ringfence.mcp._schemas import FileContent, FileEntry, FileListing, FileWritten

__all__ = ["FileTools", "entry_view"]

DEFAULT_READ_BYTES = 100_000
MAX_READ_BYTES = 1_000_000
MAX_ENTRIES = 1000

Path = Annotated[str, Field(min_length=1, description="Absolute, or relative to /home/user.")]
Encoding = Literal["utf-8", "base64"]

_READ_ONLY = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
_WRITES = ToolAnnotations(readOnlyHint=False, destructiveHint=True, openWorldHint=False)
_TYPES = {FileType.FILE: "file", FileType.DIRECTORY: "dir", FileType.SYMLINK: "symlink"}


def entry_view(entry: EntryInfo) -> FileEntry:
    kind = _TYPES.get(entry.type, "other") if entry.type is not None else "other"
    return FileEntry(
        name=entry.name, path=entry.path, type=kind,
        size=entry.size, modified=entry.modified_time,
    )  # fmt: skip


def decoded(data: bytes, whole: bool) -> str | None:
    """``data`` as UTF-8 text (a character cut at the end of a partial read dropped), or
    None if it is not text."""
    try:
        return codecs.getincrementaldecoder("utf-8")("strict").decode(data, final=whole)
    except UnicodeDecodeError:
        return None


class FileTools:
    def __init__(self, connector: Connector) -> None:
        self._connector = connector

    def register(self, server: MCPServer) -> None:
        add_tool(server, self.files_read, "Read a file", _READ_ONLY)
        add_tool(server, self.files_write, "Write a file", _WRITES)
        add_tool(server, self.files_list, "List a directory", _READ_ONLY)

    async def files_read(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        path: Path,
        encoding: Annotated[
            Encoding,
            Field(
                description="utf-8 for text; base64 for any bytes. A file that is not "
                "UTF-8 text is an error with utf-8."
            ),
        ] = "utf-8",
        max_bytes: Annotated[
            int, Field(ge=1, le=MAX_READ_BYTES, description="Most bytes to read from the start.")
        ] = DEFAULT_READ_BYTES,
    ) -> FileContent:
        """Read a file in the sandbox: its first max_bytes bytes (truncated says whether
        there is more)."""
        parts: list[bytes] = []
        size = 0
        async with session(self._connector, ctx) as rf:
            sandbox = await rf.running(sandbox_id)
            stream = cast(AsyncGenerator[bytes, None], sandbox.files.read_stream(path))
            async with aclosing(stream) as chunks:
                async for chunk in chunks:
                    parts.append(chunk)
                    size += len(chunk)
                    if size > max_bytes:
                        break
        data = b"".join(parts)
        truncated = len(data) > max_bytes
        data = data[:max_bytes]
        if encoding == "base64":
            content = base64.b64encode(data).decode()
        else:
            text = decoded(data, whole=not truncated)
            if text is None:
                raise tool_error(
                    InvalidRequest(f"{path} is not UTF-8 text: read it with encoding base64")
                )
            content = text
        return FileContent(
            sandbox_id=sandbox_id, path=path, encoding=encoding, content=content,
            bytes_read=len(data), truncated=truncated,
        )  # fmt: skip

    async def files_write(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        path: Path,
        content: Annotated[str, Field(description="The whole new content of the file.")],
        encoding: Annotated[
            Encoding, Field(description="How content is encoded: utf-8 text or base64 bytes.")
        ] = "utf-8",
    ) -> FileWritten:
        """Create or replace a file in the sandbox (its parent directories are created)."""
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise tool_error(InvalidRequest(f"content is not base64: {exc}")) from exc
        else:
            data = content.encode("utf-8", errors="surrogateescape")
        async with session(self._connector, ctx) as rf:
            sandbox = await rf.running(sandbox_id)
            written = await sandbox.files.write(path, data)
        return FileWritten(sandbox_id=sandbox_id, path=written.path, bytes_written=len(data))

    async def files_list(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        path: Annotated[
            str, Field(description="A directory; absolute, or relative to /home/user.")
        ] = "/home/user",
        depth: Annotated[
            int, Field(ge=1, le=10, description="Levels to descend; 1: its children.")
        ] = 1,
        max_entries: Annotated[
            int, Field(ge=1, le=MAX_ENTRIES, description="Most entries to return.")
        ] = 200,
    ) -> FileListing:
        """List a directory in the sandbox (depth levels deep)."""
        async with session(self._connector, ctx) as rf:
            sandbox = await rf.running(sandbox_id)
            entries = await sandbox.files.list(path, depth)
        return FileListing(
            sandbox_id=sandbox_id, path=path,
            entries=[entry_view(e) for e in entries[:max_entries]],
            truncated=len(entries) > max_entries,
        )  # fmt: skip
