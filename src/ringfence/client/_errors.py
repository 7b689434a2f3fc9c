"""Errors only the SDK raises: about commands and files inside a sandbox.

They extend the tree of ``ringfence.errors`` (each with a stable ``code``):

    RingfenceError
    ├── NotFound
    │   ├── FileNotFound          no file or directory at that path in the sandbox
    │   └── ProcessNotFound       no running process with that pid in the sandbox
    ├── CommandExitError          a command exited non-zero (``CommandResult.check``)
    │   └── CommandTimeout        a command reached its deadline and was killed
    └── ResourceExhausted         the sandbox's disk is full, or a listing is too large

The sandbox daemon's Connect error codes map to these (``not_found``), to ``InvalidRequest``
(``invalid_argument``, ``already_exists``, ``permission_denied``, ``failed_precondition``,
``unimplemented``) or to ``SandboxError`` (anything else).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringfence.errors import NotFound, RingfenceError

if TYPE_CHECKING:
    from ringfence.client._types import CommandResult

__all__ = [
    "CommandExitError",
    "CommandTimeout",
    "FileNotFound",
    "ProcessNotFound",
    "ResourceExhausted",
]


class FileNotFound(NotFound):
    """No file or directory exists at this path in the sandbox."""


class ProcessNotFound(NotFound):
    """No process with this pid runs in the sandbox (it never did, or it has exited)."""


class CommandExitError(RingfenceError):
    """The command exited with a non-zero status; ``result`` has its output and exit code."""

    code = "command_exit"

    def __init__(self, message: str, result: CommandResult) -> None:
        super().__init__(message)
        self.result = result

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def stdout(self) -> str:
        return self.result.stdout

    @property
    def stderr(self) -> str:
        return self.result.stderr


class CommandTimeout(CommandExitError):
    """The command ran past its ``timeout``: its whole process group was killed.
    ``result`` holds the output it produced until then."""

    code = "command_timeout"


class ResourceExhausted(RingfenceError):
    """The sandbox ran out of something: disk space (HTTP 507), inotify watches, or a
    directory listing over the daemon's entry limit."""

    code = "resource_exhausted"
