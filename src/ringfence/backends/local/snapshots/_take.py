"""Taking one incremental snapshot of a sandbox's layers (the sandbox frozen meanwhile).

An entry whose inode, ctime and size are those recorded at the previous snapshot is
hard-linked from it; any other is copied. ctime is the kernel's: the sandbox cannot set it,
and every change of content, mode, owner, links or xattrs moves it. An entry changed in the
very clock tick the previous snapshot began in could keep its ctime through a change made
just after the thaw, so only entries whose ctime is older than that tick are recorded as
reusable ("racy" ones are copied again next time, as git does with its index).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass, field

from ringfence.backends.local.snapshots import _fs
from ringfence.backends.local.snapshots._fs import Kind, Owners
from ringfence.errors import SandboxError, SnapshotBudgetExceeded

_CLOCK_REALTIME_COARSE = 5  # the clock file times come from (Linux's clockid)
MAX_DEPTH = 512  # directories deeper than this are refused (the walks recurse, hold fds)

LiveId = tuple[int, int, int, int]
"""What an unchanged entry looks like: live inode, ctime_ns, size; and its snapshot inode."""


def coarse_now_ns() -> int:
    return time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)


@dataclass
class Taken:
    """What one take produced, beyond the files: the books for the next one."""

    live: dict[str, LiveId] = field(default_factory=dict)  # "layer/path" -> unchanged test
    blobs: dict[int, int] = field(default_factory=dict)  # snapshot inode -> size, every file
    added: int = 0  # bytes copied (not shared with an earlier snapshot)
    files: int = 0  # entries captured
    entries: int = 0  # names made in the snapshot (every layer root, dir, link, copy)
    skipped: list[str] = field(default_factory=list)  # fifos and sockets (not captured)
    links: dict[str, str] = field(default_factory=dict)  # a hard link's path -> its group's first


class Taker:
    """Copies layers into a new snapshot directory, linking what ``previous`` still holds."""

    def __init__(
        self,
        owners: Owners,
        previous: dict[str, LiveId] | None,
        room: int,
        floor_ns: int,
        entries_room: int,
        mapped: frozenset[tuple[int, int]] = frozenset(),
    ) -> None:
        self.owners = owners
        self.mapped = mapped  # files mapped shared+writable: changed whatever ctime says
        self.previous = previous or {}
        self.room = room  # bytes the budget has left
        self.entries_room = entries_room  # names the budget has left
        self.floor_ns = floor_ns
        self.taken = Taken()
        self._groups: dict[tuple[int, int], tuple[str, int]] = {}  # live inode -> first, ino
        self._snap_root = -1

    def layer(self, name: str, live_fd: int, snap_parent: int, previous_parent: int | None) -> None:
        self._snap_root = snap_parent
        st = os.fstat(live_fd)
        self.owners.check(st, name)
        self._count_entry()
        os.mkdir(name, 0o700, dir_fd=snap_parent)
        with _fs.opened_dir(snap_parent, name) as snap_fd:
            previous_fd = _open_or_none(previous_parent, name)
            try:
                self._dir(live_fd, snap_fd, previous_fd, name, st.st_dev)
            finally:
                if previous_fd is not None:
                    os.close(previous_fd)
            _fs.write_xattrs(snap_fd, _fs.read_xattrs(live_fd))
            _fs.set_meta_fd(snap_fd, st, st.st_uid, st.st_gid)

    def _dir(
        self, live_fd: int, snap_fd: int, prev_fd: int | None, where: str, dev: int, depth: int = 1
    ) -> None:
        if depth > MAX_DEPTH:
            raise SandboxError(f"refusing {where}: directories nest deeper than {MAX_DEPTH}")
        for name in _fs.names(live_fd):
            st = _fs.lstat_at(live_fd, name)
            if st is None:
                continue
            path = f"{where}/{name}"
            kind = _fs.kind_of(st, path)
            if kind is Kind.SKIPPED:
                self.taken.skipped.append(path)
                continue
            if st.st_dev != dev:
                raise SandboxError(f"refusing {path}: another filesystem is mounted there")
            self.owners.check(st, path)
            self.taken.files += 1
            self._count_entry()
            if kind is Kind.FILE:
                group = self._groups.get((st.st_dev, st.st_ino)) if st.st_nlink > 1 else None
                if group is not None:  # a hard link of a file already captured: link it too
                    snap_ino = self._link_in_group(snap_fd, name, path, *group)
                else:
                    snap_ino = self._file(live_fd, snap_fd, prev_fd, name, path, st)
                    if st.st_nlink > 1:
                        self._groups[(st.st_dev, st.st_ino)] = (path, snap_ino)
                if st.st_ctime_ns < self.floor_ns and (st.st_dev, st.st_ino) not in self.mapped:
                    self.taken.live[path] = (st.st_ino, st.st_ctime_ns, st.st_size, snap_ino)
            elif kind is Kind.DIR:
                os.mkdir(name, 0o700, dir_fd=snap_fd)
                with (
                    _fs.opened_dir(live_fd, name) as live_child,
                    _fs.opened_dir(snap_fd, name) as snap_child,
                ):
                    prev_child = _open_or_none(prev_fd, name)
                    try:
                        self._dir(live_child, snap_child, prev_child, path, dev, depth + 1)
                    finally:
                        if prev_child is not None:
                            os.close(prev_child)
                    _fs.write_xattrs(snap_child, _fs.read_xattrs(live_child))
                    _fs.set_meta_fd(snap_child, st, st.st_uid, st.st_gid)
            else:
                if kind is Kind.SYMLINK:
                    os.symlink(os.readlink(name, dir_fd=live_fd), name, dir_fd=snap_fd)
                else:
                    _fs.make_whiteout(snap_fd, name)
                xattrs = _fs.read_xattrs(_fs.proc_path(live_fd, name))
                if xattrs:
                    _fs.write_xattrs(_fs.proc_path(snap_fd, name), xattrs)
                _fs.set_meta_at(snap_fd, name, st, st.st_uid, st.st_gid)

    def _count_entry(self) -> None:
        """Count one name about to be made in the snapshot against the entries budget."""
        if self.taken.entries >= self.entries_room:
            raise SnapshotBudgetExceeded(
                f"this checkpoint needs more than the {max(self.entries_room, 0)} entries "
                "(files, directories, links) its budget has left: delete a checkpoint"
            )
        self.taken.entries += 1

    def _link_in_group(self, snap_fd: int, name: str, path: str, first: str, ino: int) -> int:
        *parents, first_name = first.split("/")
        with _fs.opened_path(self._snap_root, parents) as first_dir:
            os.link(
                first_name, name, src_dir_fd=first_dir, dst_dir_fd=snap_fd, follow_symlinks=False
            )
        self.taken.links[path] = first
        return ino

    def _file(
        self,
        live_fd: int,
        snap_fd: int,
        prev_fd: int | None,
        name: str,
        path: str,
        st: os.stat_result,
    ) -> int:
        before = self.previous.get(path)
        if (
            prev_fd is not None
            and before is not None
            and before[:3] == _live_id(st)
            and (st.st_dev, st.st_ino) not in self.mapped
        ):
            try:
                os.link(name, name, src_dir_fd=prev_fd, dst_dir_fd=snap_fd, follow_symlinks=False)
                self.taken.blobs[before[3]] = st.st_size
                return before[3]
            except FileNotFoundError:
                pass  # not in that snapshot after all: copy
        if self.taken.added + st.st_size > self.room:
            raise SnapshotBudgetExceeded(
                f"this checkpoint needs more than the {self.room} bytes its budget has left: "
                "delete a checkpoint"
            )
        with _fs.opened_file(live_fd, name, st) as src:
            dst = os.open(name, _fs.CREATE_FLAGS, 0o600, dir_fd=snap_fd)
            try:
                _fs.copy_data(src, dst)
                _fs.write_xattrs(dst, _fs.read_xattrs(src))
                _fs.set_meta_fd(dst, st, st.st_uid, st.st_gid)
                ino = os.fstat(dst).st_ino
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise SnapshotBudgetExceeded("the sandbox's volume is full") from exc
                raise
            finally:
                os.close(dst)
        self.taken.added += st.st_size
        self.taken.blobs[ino] = st.st_size
        return ino


def _live_id(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_ctime_ns, st.st_size)


def _open_or_none(parent: int | None, name: str) -> int | None:
    if parent is None:
        return None
    try:
        fd = os.open(name, _fs.DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def unchanged(previous: dict[str, LiveId], path: str, st: os.stat_result) -> bool:
    """Whether the live entry at ``path`` is as it was when ``previous`` was taken."""
    before = previous.get(path)
    return before is not None and before[:3] == _live_id(st)
