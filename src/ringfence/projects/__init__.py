"""A host directory's copy-on-write view in a sandbox: what the sandbox changed, and
applying chosen changes back (docs/design.md 14.7).

The runtime shows the directory inside the sandbox as an overlay whose lower layer is a
read-only view of it and whose upper layer (on the sandbox's own volume) takes every
write. This package reads that upper layer host-side and compares it with the directory
(``diff``), and applies selected changes to the directory (``sync``). Both run off the
event loop, in a thread of their own with the directory owner's filesystem ids and no
capability but reading (``_creds``): the server is root, a sync does only what the owner
could. Both walk both trees through directory descriptors, nothing followed (``_fs``).

- ``_changes``: the upper layer read as added, modified and deleted entries;
- ``_diff``: those as the API shows them, with unified diffs of text files;
- ``_sync``: applying them, refusing what would leave the directory or make what a host
  must never get from a sandbox (devices, fifos, setuid files, links out);
- ``_sensitive``: the paths the host runs or trusts (``.git``, ``.envrc``, editor and
  shell configuration), which the diff flags and a sync takes only when asked by name.

Blocking functions: call them in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from ringfence.models import ProjectChange, SyncedChange, SyncRefusal
from ringfence.projects._changes import Owner, ProjectError, read_changes
from ringfence.projects._creds import run_as_owner
from ringfence.projects._diff import render
from ringfence.projects._fs import open_dir_path
from ringfence.projects._sync import DEFAULT_MAX_BYTES
from ringfence.projects._sync import sync as _apply

__all__ = [
    "DEFAULT_MAX_BYTES",
    "Owner",
    "ProjectError",
    "diff",
    "open_dir_path",
    "owner_of",
    "sync",
]


def owner_of(source: Path) -> Owner:
    """Who owns the host directory ``source`` (opened without following).

    Raises:
        OSError: it cannot be opened so.
    """
    fd = open_dir_path(str(source))
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return Owner(st.st_uid, st.st_gid)


def diff(upper: Path, source: Path) -> tuple[list[ProjectChange], bool]:
    """What the sandbox changed (its project layer ``upper``) against ``source``: the
    changes in path order, and whether some diff text was left out for the answer's cap.

    Raises:
        ProjectError: the layer holds what no sandbox's overlay makes.
        OSError: ``source`` or ``upper`` cannot be opened without following a link.
    """
    owner = owner_of(source)

    def read() -> tuple[list[ProjectChange], bool]:
        with _opened(upper, source) as (upper_fd, host_fd):
            return render(read_changes(upper_fd, host_fd, owner), upper_fd, host_fd, owner)

    return run_as_owner(owner.uid, owner.gid, read)


def sync(
    upper: Path,
    source: Path,
    paths: Sequence[str] | None,
    include_sensitive: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[list[SyncedChange], list[SyncRefusal]]:
    """Apply the changes at or below ``paths`` (project-relative, checked with
    ``models.project_relative``; None: all) to ``source``, as its owner: what was applied
    and what refused, with why. Paths the host runs or trusts (``_sensitive``: ``.git``,
    ``.envrc``, editor and shell configuration) are refused unless ``include_sensitive``
    and a requested path names them. The data one sync writes stays within ``max_bytes``
    (the sandbox's disk limit), holes kept, each of the layer's files written once.

    Raises:
        ProjectError, OSError: as for ``diff`` (nothing was applied then).
    """
    owner = owner_of(source)

    def apply() -> tuple[list[SyncedChange], list[SyncRefusal]]:
        with _opened(upper, source) as (upper_fd, host_fd):
            return _apply(upper_fd, host_fd, owner, paths, include_sensitive, max_bytes)

    return run_as_owner(owner.uid, owner.gid, apply)


@contextlib.contextmanager
def _opened(upper: Path, source: Path) -> Iterator[tuple[int, int]]:
    """The upper layer and the host directory, both opened from ``/`` without following."""
    upper_fd = open_dir_path(str(upper))
    try:
        host_fd = open_dir_path(str(source))
        try:
            yield upper_fd, host_fd
        finally:
            os.close(host_fd)
    finally:
        os.close(upper_fd)
