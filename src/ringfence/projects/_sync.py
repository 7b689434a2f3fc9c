"""Applying a sandbox's project changes to the host directory, as its owner.

Everything runs in one thread with the owner's filesystem ids (``_creds``), so nothing is
done that the owner could not do, and every file made belongs to the owner. The host
directory is reached only through its descriptor: every parent of a change is opened
component by component with ``O_NOFOLLOW`` and must be on the directory's own mount, so a
symlink (planted before, or swapped in during the sync) or a mount inside the project
refuses that change instead of leading out. Files are written to a fresh temporary name in
their directory (``O_EXCL|O_NOFOLLOW``) and renamed over the old name: a reader sees the
old file or the new one, an existing hard link (maybe to a file outside the project) is
replaced as a name, never written through. Never made: device nodes, fifos, sockets, files
with setuid or setgid bits (refused), links whose target is absolute or leaves the project
(refused: an absolute target inside the sandbox names the sandbox's file, not the host's),
hard links (a file the layer holds under several names is written once, under the first
name chosen; its other names are refused). What one sync writes is bounded: holes stay
holes (a sparse file is not made dense), and the data bytes written together never pass
``max_bytes`` (the sandbox's disk limit: a sync writes no more than the sandbox could
hold); the file that would pass it is refused, and so is every later one holding data.
Deletions remove the name (a directory with everything below it, no mount entered).
Modes come from the sandbox with group and other write bits dropped (a 022 umask), and
setgid and sticky bits too on directories.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field

from ringfence.models import SyncedChange, SyncRefusal
from ringfence.projects import _fs
from ringfence.projects._changes import Change, Owner, read_changes, shown_name
from ringfence.projects._sensitive import is_sensitive

__all__ = ["DEFAULT_MAX_BYTES", "sync"]

_TEMP_PREFIX = ".rf-sync-"
# The permission bits a sync keeps of the sandbox's: never group or other write (as a
# umask of 022 would), so a sandbox cannot open the owner's checkout to every local user.
_MODE_BITS = 0o755
DEFAULT_MAX_BYTES = 256 << 20  # the sandbox's default disk limit (``Config.default_limits``)
_TOO_LARGE = (
    "too large: this sync would write more data than the sandbox's disk limit; sync the "
    "rest separately"
)
_SENSITIVE = (
    "the host runs or trusts it (git config or hooks, editor, shell or tool "
    "configuration): synced only when named and include_sensitive is set"
)


class _Refused(Exception):
    """A change is not applied, for ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def sync(
    upper_fd: int,
    host_fd: int,
    owner: Owner,
    paths: Sequence[str] | None,
    include_sensitive: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[list[SyncedChange], list[SyncRefusal]]:
    """Apply the changes at or below ``paths`` (project-relative, checked already; None:
    every change); what was applied and what refused, in path order. Call it in the
    owner's thread (``run_as_owner``). A sensitive change (``_sensitive``) is applied only
    when ``include_sensitive`` and a requested path that is itself sensitive selects it.

    Raises:
        ProjectError: the layer cannot be read (nothing was applied).
    """
    changes = read_changes(upper_fd, host_fd, owner)
    selected, refused = _select(changes, paths)
    named = [] if paths is None or not include_sensitive else paths
    allowed = {p for p in named if is_sensitive(p.split("/"))}
    kept = []
    for change in selected:
        if is_sensitive(change.parts) and not _named(change.path, allowed):
            refused.append(SyncRefusal(path=change.path, reason=_SENSITIVE))
        else:
            kept.append(change)
    selected = kept
    mount = _fs.mount_of(host_fd)
    writes = _Writes(max_bytes)
    applied: list[SyncedChange] = []
    removed: list[tuple[str, ...]] = []  # deleted directories: nothing below them is left
    parents = _HostParents(host_fd, _fs.DirChain(upper_fd), mount)
    try:
        for change in selected:
            if any(change.parts[: len(gone)] == gone for gone in removed):
                continue
            try:
                _apply(change, parents, writes)
            except _Refused as exc:
                refused.append(SyncRefusal(path=change.path, reason=exc.reason))
                continue
            except OSError as exc:
                refused.append(SyncRefusal(path=change.path, reason=_reason(exc)))
                continue
            if change.action == "deleted" and change.kind == "dir":
                removed.append(change.parts)
            applied.append(SyncedChange(path=change.path, action=change.action, kind=change.kind))
    finally:
        parents.close()
    return applied, sorted(refused, key=lambda refusal: refusal.path)


def _named(path: str, allowed: set[str]) -> bool:
    return any(path == name or path.startswith(name + "/") for name in allowed)


def _select(
    changes: list[Change], paths: Sequence[str] | None
) -> tuple[list[Change], list[SyncRefusal]]:
    if paths is None:
        return changes, []
    chosen: dict[str, Change] = {}
    refused = []
    for path in paths:
        found = [c for c in changes if c.path == path or c.path.startswith(path + "/")]
        if not found:
            refused.append(SyncRefusal(path=path, reason="no change at this path"))
        chosen.update((change.path, change) for change in found)
    return sorted(chosen.values(), key=lambda change: change.parts), refused


@dataclass
class _Writes:
    """What this sync wrote so far: data bytes left of its bound, and the layer's inodes
    already written (each once, however many names it has)."""

    left: int
    inodes: set[tuple[int, int]] = field(default_factory=set)


def _apply(change: Change, parents: _HostParents, writes: _Writes) -> None:
    *names, name = change.parts
    mount = parents.mount
    if change.kind == "other" and change.action != "deleted":
        raise _Refused("a fifo, socket or device: special files are never made on the host")
    if change.kind == "symlink" and change.action != "deleted":
        _check_link(change)
    parent = parents.open(names, make=change.action != "deleted")
    if parent is None:
        return  # a deletion whose directory is gone from the host: nothing left to remove
    try:
        if change.action == "deleted":
            if _clear(parent, name, mount, change.host) is not None:
                os.unlink(name, dir_fd=parent)
        elif change.kind == "dir":
            _make_dir(parent, name, change, mount)
        elif change.kind == "symlink":
            _make_link(parent, name, change, mount)
        else:
            _write_file(parent, name, change, parents.upper, mount, writes)
    finally:
        os.close(parent)


class _HostParents:
    """The host directories the last change went in, kept open from the project's root
    down, so a change beside or below the last one opens only the components it does not
    share (a sync's opens are linear in its changes, never a depth-long walk each). Every
    component is opened without following and checked to be a directory on the
    project's mount (``mount``); directories the sandbox made and the host lacks
    are made (as the owner, with the sandbox's mode masked). A change touches only its own
    name, never one of its parents, so what is kept stays what was checked."""

    def __init__(self, host_fd: int, upper: _fs.DirChain, mount: int) -> None:
        self._root, self.upper, self.mount = host_fd, upper, mount
        self._names: list[str] = []
        self._fds: list[int] = []

    def close(self) -> None:
        self._drop(0)
        self.upper.close()

    def _drop(self, keep: int) -> None:
        while len(self._fds) > keep:
            os.close(self._fds.pop())
            self._names.pop()

    def open(self, parents: list[str], make: bool) -> int | None:
        """A new descriptor of the directory ``parents`` (the caller closes it); None when
        one is missing and not ``make``."""
        _fs.check_names(parents)
        keep = 0
        for have, want in zip(self._names, parents, strict=False):
            if have != want:
                break
            keep += 1
        self._drop(keep)
        for depth in range(keep, len(parents)):
            fd = self._fds[-1] if self._fds else self._root
            part = parents[depth]
            st = _fs.lstat_at(fd, part)
            if st is None and not make:
                return None
            if st is None:
                mode = _upper_mode(self.upper, parents[: depth + 1])
                os.mkdir(part, 0o700, dir_fd=fd)
                os.chmod(part, mode, dir_fd=fd, follow_symlinks=False)
            elif not stat.S_ISDIR(st.st_mode):
                where = "/".join(map(shown_name, parents[: depth + 1]))
                raise _Refused(f"{where} is not a directory on the host (a link, or a file)")
            _fs.check_mount(fd, part, self.mount)
            self._fds.append(os.open(part, _fs.DIR_FLAGS, dir_fd=fd))
            self._names.append(part)
        return os.dup(self._fds[-1] if self._fds else self._root)


def _upper_mode(upper: _fs.DirChain, parts: list[str]) -> int:
    st = _fs.lstat_at(upper.open(parts[:-1]), parts[-1])
    if st is None or not stat.S_ISDIR(st.st_mode):
        where = "/".join(map(shown_name, parts))
        raise _Refused(f"{where} is not a directory in the sandbox any more")
    return stat.S_IMODE(st.st_mode) & _MODE_BITS


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What must not have changed on the host since the changes were read: the same
    inode, kind, size and modification time (a file edited in place meanwhile differs)."""
    return (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)


def _clear(
    parent: int, name: str, mount: int, expected: os.stat_result | None, keep_dir: bool = False
) -> os.stat_result | None:
    """Make room for ``name``: what the host has there must still be what the changes
    were read against (``expected``; None: nothing), else the change is refused (a host
    file created or edited meanwhile is never overwritten unseen). A directory in the way
    is removed (unless ``keep_dir``); other entries are left for the caller to replace."""
    st = _fs.lstat_at(parent, name)
    if st is None:
        return None
    # A directory kept in place may have gained entries (its times change): same inode.
    kept = (
        keep_dir
        and expected is not None
        and stat.S_ISDIR(st.st_mode)
        and stat.S_ISDIR(expected.st_mode)
        and st.st_ino == expected.st_ino
    )
    if not kept and (expected is None or _identity(st) != _identity(expected)):
        raise _Refused("it changed on the host since the sync read it: sync again")
    _fs.check_mount(parent, name, mount)
    if stat.S_ISDIR(st.st_mode) and not keep_dir:
        _fs.remove_tree(parent, name, mount)
        return None
    return st


def _make_dir(parent: int, name: str, change: Change, mount: int) -> None:
    assert change.upper is not None
    st = _clear(parent, name, mount, change.host, keep_dir=True)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        st = None
    if st is None:
        os.mkdir(name, 0o700, dir_fd=parent)
        os.chmod(name, stat.S_IMODE(change.upper.st_mode) & _MODE_BITS, dir_fd=parent,
                 follow_symlinks=False)  # fmt: skip


def _check_link(change: Change) -> None:
    """Refuse a link whose target is absolute or could lead out of the project: only
    leading ``..`` components are taken (each climbs a real directory of the project, the
    link's own parents, opened without following), never one after a name (that name
    could itself be a link elsewhere on the host)."""
    target = change.target
    assert target is not None
    if target.startswith("/"):
        raise _Refused(
            f"a link to the absolute path {target!r}: inside the sandbox it names the "
            "sandbox's file, on the host another one"
        )
    parts = [part for part in target.split("/") if part not in ("", ".")]
    climbs = next((i for i, part in enumerate(parts) if part != ".."), len(parts))
    if ".." in parts[climbs:]:
        raise _Refused(f"a link to {target!r}: '..' after a name is never made on the host")
    if climbs > len(change.parts) - 1:
        raise _Refused(f"a link to {target!r}, which leaves the project")


def _make_link(parent: int, name: str, change: Change, mount: int) -> None:
    target = change.target
    assert target is not None
    _clear(parent, name, mount, change.host)
    temp = _temp_name()
    os.symlink(target, temp, dir_fd=parent)
    _rename_into(parent, temp, name)


def _write_file(
    parent: int, name: str, change: Change, upper: _fs.DirChain, mount: int, writes: _Writes
) -> None:
    assert change.upper is not None
    mode = stat.S_IMODE(change.upper.st_mode)
    if mode & (stat.S_ISUID | stat.S_ISGID):
        raise _Refused("setuid or setgid bits: such a file is never made on the host")
    inode = (change.upper.st_dev, change.upper.st_ino)
    if inode in writes.inodes:
        raise _Refused(
            "another name of a file this sync wrote already (hard links are written once)"
        )
    if min(change.upper.st_size, change.upper.st_blocks * 512) > writes.left:
        writes.left = 0  # and nothing after it: the bound is spent
        raise _Refused(_TOO_LARGE)
    with _fs.opened_file(upper.open(change.parts[:-1]), name, change.upper) as source:
        _clear(parent, name, mount, change.host)
        temp = _temp_name()
        fd = os.open(temp, _fs.CREATE_FLAGS, 0o600, dir_fd=parent)
        try:
            try:
                try:
                    writes.left -= _fs.copy_data(source, fd, change.upper.st_size, writes.left)
                except _fs.TooLarge:
                    writes.left = 0
                    raise _Refused(_TOO_LARGE) from None
                os.fchmod(fd, mode & _MODE_BITS)
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            os.unlink(temp, dir_fd=parent)
            raise
    _rename_into(parent, temp, name)
    writes.inodes.add(inode)


def _rename_into(parent: int, temp: str, name: str) -> None:
    try:
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        os.unlink(temp, dir_fd=parent)
        raise


def _temp_name() -> str:
    return _TEMP_PREFIX + secrets.token_hex(8)


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a parent on the host is a link or not a directory"
    if exc.errno == errno.EXDEV:
        return "another file system is mounted there on the host"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "the directory's owner may not change it"
    if exc.errno == errno.ESTALE:
        return "the sandbox changed it while it was read: sync again"
    return f"{os.strerror(exc.errno or 0)}"
