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
should be. So is a layer past the walk's caps (``MAX_ENTRIES`` entries, ``MAX_DEPTH``
levels, ``MAX_PATH`` characters in a path, ``MAX_COMPONENTS`` names in all paths), each
checked while the layer is listed: the walk's time and memory are linear in what it
reads, and bounded. The walk keeps one descriptor per level open (the chain from the root
to the directory being read) and never reopens a directory from the root.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from ringfence.errors import SandboxError
from ringfence.models.projects import ChangeAction, EntryKind
from ringfence.projects import _fs

__all__ = [
    "MAX_COMPONENTS",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_PATH",
    "Change",
    "Owner",
    "ProjectError",
    "read_changes",
    "shown_name",
]

MAX_ENTRIES = 200_000
MAX_DEPTH = 256  # directories nested in the layer
MAX_PATH = 4096  # characters of one path (PATH_MAX: the host could not use a longer one)
# Names in all paths together: what the changes' paths hold in memory (and a sync opens).
MAX_COMPONENTS = 4_000_000
# A file or link where the host has a directory: a sync removes that directory, whose
# entries the diff does not list one by one.
REPLACES_DIR = "replaces a directory on the host, with everything in it"
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

    @functools.cached_property
    def path(self) -> str:
        """As the API shows it (and a sync's paths select it): see ``shown_name``."""
        return _shown(self.parts)


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


@dataclass(frozen=True)
class _Dir:
    """A directory of the upper layer still to read, below the directory being read."""

    name: str
    parts: tuple[str, ...]
    opaque: bool
    on_host: bool  # the host has a directory at the same path


@dataclass
class _Level:
    """One directory of the walk, open: its upper and host descriptors and the
    directories below it still to read. The walk keeps the chain of these open (one per
    level, bounded by ``MAX_DEPTH``), so no directory is ever reopened from the root."""

    upper: int
    host: int | None
    below: Iterator[_Dir]

    def close(self) -> None:
        os.close(self.upper)
        if self.host is not None:
            os.close(self.host)


@dataclass
class _Budget:
    """What the walk has taken so far, against the caps (each checked as it grows, so a
    hostile layer is refused after at most one cap's worth of work)."""

    entries: int = 0
    components: int = 0

    def entry(self, parts: tuple[str, ...]) -> None:
        self.entries += 1
        self.components += len(parts)
        if self.entries > MAX_ENTRIES:
            raise ProjectError(f"the project layer holds more than {MAX_ENTRIES} entries")
        if self.components > MAX_COMPONENTS:
            raise ProjectError(
                f"the project layer's paths hold more than {MAX_COMPONENTS} names together "
                "(too many entries too deep)"
            )
        if len(parts) > MAX_DEPTH:
            raise ProjectError(
                f"the project layer is deeper than {MAX_DEPTH} directories "
                f"at {_shown(parts[:8])}/..."
            )
        if sum(len(part) + 1 for part in parts) > MAX_PATH:
            raise ProjectError(
                f"the project layer has a path longer than {MAX_PATH} characters "
                f"at {_shown(parts[:8])}/..."
            )


def read_changes(upper_fd: int, host_fd: int, owner: Owner) -> list[Change]:
    """Every change of the upper layer ``upper_fd`` over the host directory ``host_fd``,
    in path order (a directory before its entries).

    Raises:
        ProjectError: the layer holds what no overlay of a sandbox makes, or too much
            (more than ``MAX_ENTRIES`` entries, ``MAX_DEPTH`` levels, ``MAX_PATH``
            characters in one path or ``MAX_COMPONENTS`` names in all paths).
    """
    device = os.fstat(upper_fd).st_dev
    changes: list[Change] = []
    budget = _Budget()
    stack: list[_Level] = []
    try:
        here = _Dir("", (), False, True)
        upper: int = os.dup(upper_fd)
        host: int | None = os.dup(host_fd)
        while True:
            try:
                if os.fstat(upper).st_dev != device:
                    raise ProjectError(
                        f"refusing the project layer: {_shown(here.parts)} is on another "
                        "file system"
                    )
                found, below = _read_dir(here, upper, host, device, owner, budget)
            except BaseException:
                os.close(upper)
                if host is not None:
                    os.close(host)
                raise
            stack.append(_Level(upper, host, iter(below)))
            changes += found
            opened = _next_dir(stack)
            if opened is None:
                break
            here, upper, host = opened
    finally:
        for level in stack:
            level.close()
    return sorted(changes, key=lambda change: change.parts)


def _next_dir(stack: list[_Level]) -> tuple[_Dir, int, int | None] | None:
    """The next directory to read (depth first), opened from its parent's descriptors;
    levels done are closed and popped. None: the walk is over."""
    while stack:
        level = stack[-1]
        for below in level.below:
            upper = _open_dir(level.upper, below.name)
            if upper is None:  # gone or swapped meanwhile (the sandbox runs): nothing to read
                continue
            host = None
            if below.on_host and level.host is not None:
                host = _open_dir(level.host, below.name)
            return below, upper, host
        stack.pop().close()
    return None


def _open_dir(dir_fd: int, name: str) -> int | None:
    """The directory ``name`` in ``dir_fd``, opened without following; None when it is
    gone, a link or not a directory."""
    try:
        return os.open(name, _fs.DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES):
            return None
        raise


def _listed(dir_fd: int, parts: tuple[str, ...], budget: _Budget) -> list[str]:
    """The names in ``dir_fd``, sorted; each counted against the budget as it is read, so
    a directory of millions of names is refused at the cap, not read whole first."""
    names = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            budget.entry((*parts, entry.name))
            names.append(entry.name)
    return sorted(names)


def _read_dir(
    here: _Dir, upper: int, host_fd: int | None, device: int, owner: Owner, budget: _Budget
) -> tuple[list[Change], list[_Dir]]:
    """The changes in one directory, and the directories below it to read."""
    changes: list[Change] = []
    below: list[_Dir] = []
    names = _listed(upper, here.parts, budget)
    for name in names:
        parts = (*here.parts, name)
        st = _fs.lstat_at(upper, name)
        if st is None:
            continue
        if st.st_dev != device:
            raise ProjectError(
                f"refusing the project layer: {_shown(parts)} is on another file system"
            )
        for key in _fs.xattr_names(upper, name):
            if key.endswith(_REFUSED_XATTRS):
                raise ProjectError(f"refusing the project layer: {_shown(parts)} has {key}")
        host = _fs.lstat_at(host_fd, name) if host_fd is not None else None
        if _is_whiteout(st):
            if host is not None:
                changes.append(Change(parts, "deleted", kind_of(host), None, host))
            continue
        kind = kind_of(st)
        if kind == "dir":
            opaque = here.opaque or any(_fs.xattr(upper, name, key) == b"y" for key in _OPAQUE)
            if host is None:
                changes.append(Change(parts, "added", "dir", st, None))
            elif not stat.S_ISDIR(host.st_mode):
                changes.append(Change(parts, "modified", "dir", st, host))
            on_host = host is not None and stat.S_ISDIR(host.st_mode)
            below.append(_Dir(name, parts, opaque, on_host))
            continue
        change = _compare(upper, host_fd, name, parts, kind, st, host, owner)
        if change is not None:
            changes.append(change)
    if here.opaque and host_fd is not None:
        kept = set(names)
        for name in _listed(host_fd, here.parts, budget):
            if name not in kept and (host := _fs.lstat_at(host_fd, name)) is not None:
                changes.append(Change((*here.parts, name), "deleted", kind_of(host), None, host))
    return changes, below


def _shown(parts: tuple[str, ...]) -> str:
    """A path as the API shows it: a name that is not UTF-8 with its bytes escaped."""
    return "/".join(shown_name(part) for part in parts)


def shown_name(name: str) -> str:
    """``name`` (as ``os.listdir`` gives it: undecodable bytes as surrogates) as text any
    JSON encoder takes and any terminal shows as it is, one-to-one (two names are never
    shown alike, so a path chosen by its shown form selects exactly one entry): an
    undecodable byte is written ``\\xNN``; a control character (C0, DEL, C1), a line or
    paragraph separator, or a bidirectional override ``\\uNNNN`` (a ``\\r``, an escape
    sequence or a reordering could hide a line from a reviewer); ``\\`` itself ``\\\\``."""
    if name.isascii() and name.isprintable() and "\\" not in name:
        return name  # the common case, checked at C speed: nothing to escape
    return "".join(_escaped(char) for char in name)


def _escaped(char: str) -> str:
    point = ord(char)
    if char == "\\":
        return "\\\\"
    if 0xDC80 <= point <= 0xDCFF:  # surrogateescape: the byte point - 0xDC00
        return f"\\x{point - 0xDC00:02x}"
    if point < 0x20 or 0x7F <= point <= 0x9F or point in _INVISIBLE or 0xD800 <= point <= 0xDFFF:
        return f"\\u{point:04x}"
    return char


# Line and paragraph separators; bidirectional embeddings, overrides and isolates.
_INVISIBLE = frozenset({0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)})


def _compare(
    upper: int,
    host_fd: int | None,
    name: str,
    parts: tuple[str, ...],
    kind: EntryKind,
    st: os.stat_result,
    host: os.stat_result | None,
    owner: Owner,
) -> Change | None:
    target = os.readlink(name, dir_fd=upper) if kind == "symlink" else None
    if host is None:
        return Change(parts, "added", kind, st, None, target)
    if kind_of(host) != kind or kind == "other":
        replaced = REPLACES_DIR if stat.S_ISDIR(host.st_mode) else None
        return Change(parts, "modified", kind, st, host, target, note=replaced)
    if kind == "symlink":
        assert host_fd is not None
        same = os.readlink(name, dir_fd=host_fd) == target
        return None if same else Change(parts, "modified", kind, st, host, target)
    if stat.S_IMODE(st.st_mode) != stat.S_IMODE(host.st_mode) or st.st_size != host.st_size:
        return Change(parts, "modified", kind, st, host)
    if not owner.may_read(host):
        note = "the host's file is not readable by the directory's owner: not compared"
        return Change(parts, "modified", kind, st, host, note=note)
    assert host_fd is not None
    with _fs.opened_file(upper, name, st) as mine, _host_file(host_fd, name, host) as theirs:
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
