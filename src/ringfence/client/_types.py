"""What the sandbox SDK returns: command results and output, processes, files, file events.

Frozen dataclasses, parsed from the daemon's proto3 JSON by the ``from_message`` functions
(pure; unknown fields are ignored, missing ones take proto3 defaults).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from ringfence.client._errors import CommandExitError

__all__ = [
    "CommandResult",
    "EntryInfo",
    "EventType",
    "FileType",
    "FilesystemEvent",
    "OutputChunk",
    "ProcessInfo",
]


@dataclass(frozen=True)
class CommandResult:
    """How a command ended. Returned for any exit status: call ``check()`` to raise on a
    non-zero one.

    ``exit_code`` is -1 when a signal killed it; then ``error`` says which ("signal: killed").
    """

    stdout: str
    stderr: str
    exit_code: int
    error: str | None = None

    def check(self) -> CommandResult:
        """This result, if the command exited with status 0.

        Raises:
            CommandExitError: it did not.
        """
        if self.exit_code != 0:
            reason = self.error or f"exit status {self.exit_code}"
            raise CommandExitError(f"the command failed: {reason}", self)
        return self


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a command's output, as it arrived."""

    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True)
class ProcessInfo:
    """A process running in the sandbox (``commands.list()``)."""

    pid: int
    cmd: str
    args: list[str]
    envs: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    tag: str | None = None

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> ProcessInfo:
        config = message.get("config") or {}
        return cls(
            pid=int(message.get("pid", 0)),
            cmd=str(config.get("cmd", "")),
            args=[str(a) for a in config.get("args") or []],
            envs={str(k): str(v) for k, v in (config.get("envs") or {}).items()},
            cwd=config.get("cwd"),
            tag=message.get("tag"),
        )


class FileType(StrEnum):
    FILE = "file"
    DIRECTORY = "dir"
    SYMLINK = "symlink"  # only for a dangling link; a link to a file is FILE, with is_symlink


_FILE_TYPES = {
    "FILE_TYPE_FILE": FileType.FILE,
    "FILE_TYPE_DIRECTORY": FileType.DIRECTORY,
    "FILE_TYPE_SYMLINK": FileType.SYMLINK,
}


@dataclass(frozen=True)
class EntryInfo:
    """A file or directory in the sandbox, as ``files.list`` and ``files.get_info`` show it."""

    name: str
    type: FileType | None  # None: neither file, directory nor link (a fifo, a socket)
    path: str
    size: int
    mode: int
    permissions: str
    owner: str
    group: str
    modified_time: datetime
    symlink_target: str | None = None
    is_symlink: bool = False

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> EntryInfo:
        modified = message.get("modifiedTime")
        return cls(
            name=str(message.get("name", "")),
            type=_FILE_TYPES.get(str(message.get("type", ""))),
            path=str(message.get("path", "")),
            size=int(message.get("size", 0)),
            mode=int(message.get("mode", 0)),
            permissions=str(message.get("permissions", "")),
            owner=str(message.get("owner", "")),
            group=str(message.get("group", "")),
            modified_time=_timestamp(modified) if modified else datetime.fromtimestamp(0, UTC),
            symlink_target=message.get("symlinkTarget"),
            is_symlink=bool(message.get("isSymlink", False)),
        )


def _timestamp(text: str) -> datetime:
    """An RFC 3339 time with up to nanoseconds (Python keeps microseconds)."""
    text = text.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6].ljust(6, '0')}{zone}"
    return datetime.fromisoformat(text)


class EventType(StrEnum):
    CREATE = "create"
    WRITE = "write"
    REMOVE = "remove"
    RENAME = "rename"
    CHMOD = "chmod"


_EVENT_TYPES = {f"EVENT_TYPE_{kind.name}": kind for kind in EventType}


@dataclass(frozen=True)
class FilesystemEvent:
    """A change under a watched directory; ``name`` is relative to it."""

    name: str
    type: EventType

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> FilesystemEvent | None:
        kind = _EVENT_TYPES.get(str(message.get("type", "")))
        return None if kind is None else cls(str(message.get("name", "")), kind)
