"""A sandbox's project view as the API shows it: what the sandbox changed in its
copy-on-write view of a host directory (``ProjectDiff``), and what a sync applied to that
directory or refused (``ProjectSyncReport``). Paths are relative to the project's root,
``/``-separated, never absolute and never with ``..`` (docs/design.md 14.7)."""

from __future__ import annotations

import posixpath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "MAX_SYNC_PATHS",
    "ChangeAction",
    "EntryKind",
    "ProjectChange",
    "ProjectDiff",
    "ProjectSyncReport",
    "ProjectSyncRequest",
    "SyncRefusal",
    "SyncedChange",
    "project_relative",
]

MAX_SYNC_PATHS = 1000
ChangeAction = Literal["added", "modified", "deleted"]
# "other": a fifo or socket the sandbox made (listed, never synced).
EntryKind = Literal["file", "dir", "symlink", "other"]


def project_relative(path: str) -> str:
    """``path`` as a project-relative path (``a/b``), or ``ValueError``: absolute paths,
    ``..`` components, NUL bytes and the empty path name nothing inside a project."""
    if "\0" in path or path.startswith("/"):
        raise ValueError(f"must be a path relative to the project: {path!r}")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts:
        raise ValueError(f"names no file of the project: {path!r}")
    if ".." in parts:
        raise ValueError(f"must not contain '..': {path!r}")
    return posixpath.join(*parts)


class ProjectChange(BaseModel):
    """One entry of the project that differs between the host directory and the sandbox's
    view of it."""

    model_config = ConfigDict(frozen=True)

    path: str = Field(
        description="Relative to the project's root, escaped one-to-one: a byte that is not "
        "UTF-8 as \\xNN, a control character, line separator or bidirectional override as "
        "\\uNNNN, a backslash as \\\\ (a sync's paths select by this form)."
    )
    action: ChangeAction = Field(
        description="added (not on the host), modified (content, mode or kind differ), "
        "deleted (on the host, removed in the sandbox)."
    )
    kind: EntryKind = Field(description="What it is in the sandbox (deleted: on the host).")
    mode: int | None = Field(None, description="Its permission bits in the sandbox.")
    size: int | None = Field(None, description="Bytes of a file in the sandbox.")
    target: str | None = Field(None, description="A symlink's target in the sandbox.")
    binary: bool = Field(False, description="A file whose content is not shown as text.")
    diff: str | None = Field(
        None,
        description="A unified diff of a text file (host first, sandbox second); None for "
        "binary files, directories, links and files too large to show.",
    )
    note: str | None = Field(None, description="Why no diff is shown, when there is none.")
    sensitive: bool = Field(
        False,
        description="A path the host runs or trusts (.git, .gitmodules, .envrc, .vscode, "
        "shell start files, package tools' configuration: docs/design.md 14.7): a sync "
        "applies it only when named with include_sensitive.",
    )


class ProjectDiff(BaseModel):
    """What the sandbox changed in its project view, in path order."""

    model_config = ConfigDict(frozen=True)

    source: str = Field(description="The host directory.")
    path: str = Field(description="Where the sandbox sees it.")
    changes: list[ProjectChange]
    truncated: bool = Field(
        False, description="Some diffs were left out: their total passed the server's cap."
    )


class ProjectSyncRequest(BaseModel):
    """Which changes to apply to the host directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    paths: list[str] | None = Field(
        None,
        max_length=MAX_SYNC_PATHS,
        description="Project-relative paths: each selects the change at it and every change "
        "below it. None: every change.",
    )
    include_sensitive: bool = Field(
        False,
        description="Also apply sensitive changes (those the diff flags: git config and "
        "hooks, editor, shell and tool configuration, which the host runs), but only those "
        "at or below a path in paths that is itself sensitive (e.g. '.git/hooks/pre-commit'"
        " or '.vscode'): never through a broader path or paths=None.",
    )

    @field_validator("paths")
    @classmethod
    def _relative(cls, paths: list[str] | None) -> list[str] | None:
        return None if paths is None else [project_relative(path) for path in paths]


class SyncedChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    action: ChangeAction
    kind: EntryKind


class SyncRefusal(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    reason: str = Field(description="Why it was not applied (nothing of it was written).")


class ProjectSyncReport(BaseModel):
    """What a sync applied to the host directory and what it refused, in path order."""

    model_config = ConfigDict(frozen=True)

    source: str = Field(description="The host directory.")
    applied: list[SyncedChange]
    refused: list[SyncRefusal]
