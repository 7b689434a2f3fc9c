"""What a sandbox changed in its project view: the overlay's upper layer compared with the
host directory below it.

The upper layer is written by hostile code: it is walked with directory descriptors only
(``_fs``), nothing followed, no mount crossed (every entry must be on the upper's own file
system). The host directory is walked beside it the same way. An entry of the upper is a
change when it differs from the host's entry of the same path:

- a whiteout (a char device 0:0) over an existing host entry: that entry is **deleted**;
- an opaque directory (``user.overlay.opaque`` or ``trusted.overlay.opaque`` "y"; overlay
  marks a directory made where one was removed): every host entry below it that the upper
  does not have is **deleted** (lookups below an opaque directory never reach the host, so
  its subdirectories hide the host's too);
- a file, link or directory the host does not have: **added** (a directory's entries too);
- a file whose bytes or permission bits differ from the host's, a link whose target does,
  or an entry of another kind than the host's: **modified**. A file the sandbox only copied
  up (opened for writing, touched) with the same bytes and mode is no change; nor is a
  directory whose mode, owner or times alone changed (a sync does not apply them).
- fifos and sockets are listed (kind ``other``) and never synced.

Redirects and metacopy (overlay features that would make an upper entry stand for another
path or hold no data) are refused whole (``ProjectError``): an unprivileged overlay has
neither (``userxattr`` turns them off), so finding one means the layer is not what it
should be. Finding more than ``MAX_ENTRIES`` entries is refused too (the walk's cost is
bounded).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from ringfence.errors import SandboxError
from ringfence.models.projects import ChangeAction, EntryKind
from ringfence.projects import _fs

__all__ = ["MAX_ENTRIES", "Change", "Owner", "ProjectError", "read_changes"]

MAX_ENTRIES = 200_000
_OPAQUE = ("user.overlay.opaque", "trusted.overlay.opaque")
_REFUSED_XATTRS = ("overlay.redirect", "overlay.metacopy")


class ProjectError(SandboxError):
    """The sandbox's project layer cannot be read as a set of changes."""


@dataclass(frozen=True)
class Owner:
    """The host directory's owner: who a sync writes as, and whose read permission decides
    whether a host file's content may be shown."""

    uid: int
    gid: int

    def may_read(self, st: os.stat_result) -> bool:
        """Whether the owner (with that gid alone) may read the file ``st`` describes:
        without capabilities, as the sandbox's user would (the view maps the owner's ids to
        it), so a diff never shows what the sandbox could not read."""
        mode = st.st_mode
        if st.st_uid == self.uid:
            return bool(mode & stat.S_IRUSR)
        if st.st_gid == self.gid:
            return bool(mode & stat.S_IRGRP)
        return bool(mode & stat.S_IROTH)


@dataclass(frozen=True)
class Change:
    """One changed entry: ``upper`` is the sandbox's (None: deleted), ``host`` the host
    directory's (None: added)."""

    parts: tuple[str, ...]
    action: ChangeAction
    kind: EntryKind  # in the sandbox (deleted: on the host)
    upper: os.stat_result | None
    host: os.stat_result | None
    target: str | None = None  # a symlink's target in the sandbox
    note: str | None = None

    @property
    def path(self) -> str:
        return "/".join(self.parts)


def kind_of(st: os.stat_result) -> EntryKind:
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


@dataclass
class _Dir:
    parts: tuple[str, ...]
    upper: int  # fd
    host: int | None  # fd of the host's directory at the same path, if it has one
    opaque: bool


def read_changes(upper_fd: int, host_fd: int, owner: Owner) -> list[Change]:
    """Every change of the upper layer ``upper_fd`` over the host directory ``host_fd``,
    in path order (a directory before its entries).

    Raises:
        ProjectError: the layer holds what no overlay of a sandbox makes, or too much.
    """
    device = os.fstat(upper_fd).st_dev
    changes: list[Change] = []
    seen = 0
    stack = [_Dir((), os.dup(upper_fd), os.dup(host_fd), False)]
    try:
        while stack:
            here = stack.pop()
            try:
                found, below = _read_dir(here, device, owner)
            finally:
                os.close(here.upper)
                if here.host is not None:
                    os.close(here.host)
            seen += len(found)
            if seen > MAX_ENTRIES:
                raise ProjectError(f"the project layer holds more than {MAX_ENTRIES} entries")
            changes += found
            stack += reversed(below)
    finally:
        for left in stack:
            os.close(left.upper)
            if left.host is not None:
                os.close(left.host)
    return sorted(changes, key=lambda change: change.parts)


def _read_dir(here: _Dir, device: int, owner: Owner) -> tuple[list[Change], list[_Dir]]:
    changes: list[Change] = []
    below: list[_Dir] = []
    names = sorted(os.listdir(here.upper))
    for name in names:
        parts = (*here.parts, name)
        st = _fs.lstat_at(here.upper, name)
        if st is None:
            continue
        where = "/".join(parts)
        if st.st_dev != device:
            raise ProjectError(f"refusing the project layer: {where} is on another file system")
        for key in _fs.xattr_names(here.upper, name):
            if key.endswith(_REFUSED_XATTRS):
                raise ProjectError(f"refusing the project layer: {where} has {key}")
        host = _fs.lstat_at(here.host, name) if here.host is not None else None
        if _is_whiteout(st):
            if host is not None:
                changes.append(Change(parts, "deleted", kind_of(host), None, host))
            continue
        kind = kind_of(st)
        if kind == "dir":
            opaque = here.opaque or any(_fs.xattr(here.upper, name, key) == b"y" for key in _OPAQUE)
            if host is None:
                changes.append(Change(parts, "added", "dir", st, None))
            elif not stat.S_ISDIR(host.st_mode):
                changes.append(Change(parts, "modified", "dir", st, host))
            host_dir = None
            if host is not None and stat.S_ISDIR(host.st_mode) and here.host is not None:
                host_dir = _open_host_dir(here.host, name)
            upper_dir = os.open(name, _fs.DIR_FLAGS, dir_fd=here.upper)
            below.append(_Dir(parts, upper_dir, host_dir, opaque))
            continue
        change = _compare(here, name, parts, kind, st, host, owner)
        if change is not None:
            changes.append(change)
    if here.opaque and here.host is not None:
        kept = set(names)
        for name in sorted(os.listdir(here.host)):
            if name not in kept and (host := _fs.lstat_at(here.host, name)) is not None:
                changes.append(Change((*here.parts, name), "deleted", kind_of(host), None, host))
    return changes, below


def _open_host_dir(host_fd: int, name: str) -> int | None:
    """The host's directory ``name``; None when it is gone or was swapped for a link."""
    try:
        return os.open(name, _fs.DIR_FLAGS, dir_fd=host_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES):
            return None
        raise


def _compare(
    here: _Dir,
    name: str,
    parts: tuple[str, ...],
    kind: EntryKind,
    st: os.stat_result,
    host: os.stat_result | None,
    owner: Owner,
) -> Change | None:
    target = os.readlink(name, dir_fd=here.upper) if kind == "symlink" else None
    if host is None:
        return Change(parts, "added", kind, st, None, target)
    if kind_of(host) != kind or kind == "other":
        return Change(parts, "modified", kind, st, host, target)
    if kind == "symlink":
        assert here.host is not None
        same = os.readlink(name, dir_fd=here.host) == target
        return None if same else Change(parts, "modified", kind, st, host, target)
    if stat.S_IMODE(st.st_mode) != stat.S_IMODE(host.st_mode) or st.st_size != host.st_size:
        return Change(parts, "modified", kind, st, host)
    if not owner.may_read(host):
        note = "the host's file is not readable by the directory's owner: not compared"
        return Change(parts, "modified", kind, st, host, note=note)
    assert here.host is not None
    with _fs.opened_file(here.upper, name, st) as mine, _host_file(here.host, name, host) as theirs:
        if theirs is None or not _fs.same_content(mine, theirs, st.st_size):
            return Change(parts, "modified", kind, st, host)
    return None


@contextlib.contextmanager
def _host_file(dir_fd: int, name: str, expect: os.stat_result) -> Iterator[int | None]:
    """The host's file ``name`` opened to compare; None when it changed or went."""
    try:
        fd = os.open(name, _fs.READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        yield None
        return
    try:
        st = os.fstat(fd)
        yield fd if (st.st_dev, st.st_ino) == (expect.st_dev, expect.st_ino) else None
    finally:
        os.close(fd)
