"""Restoring a snapshot into live layers in place, the sandbox frozen meanwhile.

Plain layers (the workspace and /tmp: bind mounts of volume directories) are changed
directly: the sandbox sees the same dentries the host changes.

An overlay's upper layer, with the overlay mounted, is not coherent with direct changes:
overlayfs caches its own dentries, positive and negative, over the upper's, and does not
revalidate them. Measured (tests/backends/test_snapshots.py pins each case): a file removed
directly in the upper stays readable through the overlay; a name the sandbox looked up and
did not find stays "not found" after it is created directly in the upper; rewriting an upper
file in place (same inode) and changing its mode, owner or times are seen at once. So:

* content and metadata of an entry that stays what it is are rewritten in place;
* every change of the namespace (an entry added, removed, or replaced by one of another
  kind) first removes the name through the overlay itself (``view``), which drops the
  overlay's dentry: host root may unlink there, though it cannot create (its uid is not
  mapped in the sandbox's user namespace). A name the overlay shows as absent (a whiteout,
  or nothing) may still have a negative dentry cached, so a fresh, unguessable file is
  made directly in the upper, renamed over the name through the overlay and unlinked
  through it. Only then is the checkpoint's entry made directly in the upper (or the
  whiteout the overlay left dropped, so the lower entry shows again); nothing runs in the
  sandbox in between to look the name up again.

A walk through the view never crosses a mount (``_fs.check_same_mount`` on every name it
removes, renames onto or enters): the sandbox's mount namespace holds binds of the host's
under its overlay. A restore is planned before its first write (``plan``: what it will
create, its bytes, the names it will touch); once it has written, any failure is
``RestoreIncomplete``. Every entry is made under its final owner before any data goes in.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from ringfence.backends.local.snapshots import _fs
from ringfence.backends.local.snapshots._fs import Kind
from ringfence.backends.local.snapshots._take import LiveId, unchanged
from ringfence.errors import SandboxError

_OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class RestoreIncomplete(SandboxError):
    """A rollback failed after it had changed the sandbox's files: they are partly the
    checkpoint's. The caller must not let the sandbox run on (kill it, or restart it from
    the checkpoint), never thaw it."""


@dataclass
class Plan:
    """What a restore will do, found before it writes anything."""

    bytes: int = 0  # pages of the volume its copies take
    freed: int = 0  # pages of the live files it removes or shrinks (not linked elsewhere)
    entries: int = 0  # names it makes
    touched: list[tuple[str, ...]] = field(default_factory=list)  # names it removes or makes
    todo: dict[str, set[str]] = field(default_factory=dict)  # "layer/dir" -> its names to do


class Restorer:
    """Makes live layers equal to snapshot layers; ``view_fd`` is the overlay's merged
    directory for an upper layer (None for plain layers and unmounted uppers)."""

    def __init__(
        self,
        recorded: dict[str, LiveId],
        links: dict[str, str],
        owner: int,
        mapped: frozenset[tuple[int, int]] = frozenset(),
    ) -> None:
        self.recorded = recorded  # the live entries as they were when the snapshot was taken
        self.links = links  # hard links of the snapshot: path -> the first path of its group
        self.owner = owner  # owns the transient files the overlay's dentries are flushed with
        self.mapped = mapped  # files mapped shared+writable: changed whatever ctime says
        self._mount = -1  # the view's mount (while a layer with a view is restored)
        self._todo: dict[str, set[str]] | None = None  # what ``plan`` found to do, by dir

    def _unchanged(self, path: str, live: os.stat_result) -> bool:
        return (live.st_dev, live.st_ino) not in self.mapped and unchanged(
            self.recorded, path, live
        )

    def plan(self, live_fd: int, snap_fd: int, name: str) -> Plan:
        """What ``layer`` would do, read only (the sandbox frozen: it stays so)."""
        plan = Plan()
        self._plan_dir(live_fd, snap_fd, name, (), plan)
        self._todo = {**(self._todo or {}), **plan.todo}  # ``layer`` does only those
        for path in self.links:
            if path.startswith(name + "/"):
                plan.entries += 1
                plan.touched.append(tuple(path.split("/")[1:]))
        return plan

    def _plan_dir(
        self, live_fd: int, snap_fd: int, where: str, rel: tuple[str, ...], plan: Plan
    ) -> bool:
        """Plan one directory; whether the restore has anything to do in it. The names of
        the snapshot's entries it must restore go to ``plan.todo`` (a directory with
        anything to do is one of its parent's): the apply looks at no other."""
        dirty = False
        todo: set[str] = set()
        wanted = _fs.names(snap_fd)
        for name in set(_fs.names(live_fd)) - set(wanted):
            st = _fs.lstat_at(live_fd, name)
            if st is not None and not _left_alone(st):
                plan.touched.append((*rel, name))
                plan.freed += _freed(st)
                dirty = True
        for name in wanted:
            path = f"{where}/{name}"
            live = _fs.lstat_at(live_fd, name)
            if live is not None and self._unchanged(path, live):
                continue
            snap = os.stat(name, dir_fd=snap_fd, follow_symlinks=False)
            kind = _fs.kind_of(snap, path)
            if live is not None and self._same_kind(live_fd, snap_fd, name, live, snap, kind):
                if kind is Kind.FILE:
                    plan.bytes += _pages(snap.st_size)
                    plan.freed += _freed(live)
                    todo.add(name)
                elif kind is Kind.DIR:
                    with _fs.opened_dir(live_fd, name) as lc, _fs.opened_dir(snap_fd, name) as sc:
                        inner = self._plan_dir(lc, sc, path, (*rel, name), plan)
                        if inner or not _same_meta(live, snap, lc, sc):
                            todo.add(name)
                elif not _same_meta(
                    live, snap, _fs.proc_path(live_fd, name), _fs.proc_path(snap_fd, name)
                ):
                    todo.add(name)
                continue
            plan.touched.append((*rel, name))
            if live is not None:
                plan.freed += _freed(live)
            _plan_create(snap_fd, name, snap, plan)
            todo.add(name)
        if todo:
            plan.todo[where] = todo
        return dirty or bool(todo)

    def layer(self, live_fd: int, snap_fd: int, view_fd: int | None, name: str) -> None:
        if view_fd is not None:
            self._mount = _fs.mount_of(view_fd)
        self._dir(live_fd, snap_fd, view_fd, name)
        for path, first in self.links.items():
            if path.startswith(name + "/"):
                parts = path.split("/")[1:]
                self._relink(live_fd, snap_fd, view_fd, parts, first.split("/")[1:])
        st = os.fstat(snap_fd)
        _fs.write_xattrs(live_fd, _fs.read_xattrs(snap_fd))
        _fs.set_meta_fd(live_fd, st, st.st_uid, st.st_gid)

    def _dir(self, live_fd: int, snap_fd: int, view_fd: int | None, where: str) -> None:
        wanted = _fs.names(snap_fd)
        for name in set(_fs.names(live_fd)) - set(wanted):
            st = _fs.lstat_at(live_fd, name)
            if st is None or _left_alone(st):
                continue  # fifos and sockets are not captured: a rollback leaves them be
            self._remove(live_fd, view_fd, name, st)  # device nodes too: never kept
        todo = None if self._todo is None else self._todo.get(where, set())
        for name in wanted:
            if todo is not None and name not in todo:
                continue  # the plan found it (and all below it) as the snapshot has it
            path = f"{where}/{name}"
            live = _fs.lstat_at(live_fd, name)
            if live is not None and self._unchanged(path, live):
                continue  # a file as it was when the snapshot was taken (only files are kept)
            snap = os.stat(name, dir_fd=snap_fd, follow_symlinks=False)
            kind = _fs.kind_of(snap, path)
            if live is not None and self._same_kind(live_fd, snap_fd, name, live, snap, kind):
                self._update(live_fd, snap_fd, name, live, snap, kind)
                if kind is Kind.DIR:
                    with self._children(live_fd, snap_fd, view_fd, name) as (lc, sc, vc):
                        self._dir(lc, sc, vc, path)
                        _fs.write_xattrs(lc, _fs.read_xattrs(sc))
                        _fs.set_meta_fd(lc, snap, snap.st_uid, snap.st_gid)
                continue
            if live is not None:
                self._remove(live_fd, view_fd, name, live)
            elif view_fd is not None:
                self._flush(live_fd, view_fd, name)
                self._drop_whiteout(live_fd, name)
            self._create(live_fd, snap_fd, name, snap, path)

    @contextlib.contextmanager
    def _children(
        self, live_fd: int, snap_fd: int, view_fd: int | None, name: str
    ) -> Iterator[tuple[int, int, int | None]]:
        with _fs.opened_dir(live_fd, name) as lc, _fs.opened_dir(snap_fd, name) as sc:
            if view_fd is None:
                yield lc, sc, None
                return
            _fs.check_same_mount(view_fd, name, self._mount, name)
            with _fs.opened_dir(view_fd, name) as vc:
                if _fs.mount_of(vc) != self._mount:
                    raise SandboxError(f"refusing {name}: something is mounted there")
                yield lc, sc, vc

    def _same_kind(
        self,
        live_fd: int,
        snap_fd: int,
        name: str,
        live: os.stat_result,
        snap: os.stat_result,
        kind: Kind,
    ) -> bool:
        """Whether the live entry can be made the snapshot's in place (same inode)."""
        if _live_kind(live) is not kind:
            return False
        if kind is Kind.FILE:
            return live.st_nlink == 1  # rewriting a hard-linked file would change its twin
        if kind is Kind.SYMLINK:
            return os.readlink(name, dir_fd=live_fd) == os.readlink(name, dir_fd=snap_fd)
        if kind is Kind.DIR:
            return _opaque(live_fd, name) == _opaque(snap_fd, name)
        return True

    def _update(
        self,
        live_fd: int,
        snap_fd: int,
        name: str,
        live: os.stat_result,
        snap: os.stat_result,
        kind: Kind,
    ) -> None:
        if kind is Kind.FILE:
            with _fs.opened_file(snap_fd, name, snap) as src:
                dst = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=live_fd)
                try:
                    now = os.fstat(dst)
                    if (now.st_dev, now.st_ino) != (live.st_dev, live.st_ino):
                        raise SandboxError(f"{name} changed during a rollback")
                    os.ftruncate(dst, 0)  # its pages freed first: the plan counted so
                    _fs.copy_data(src, dst)
                    _fs.write_xattrs(dst, _fs.read_xattrs(src))
                    _fs.set_meta_fd(dst, snap, snap.st_uid, snap.st_gid)
                finally:
                    os.close(dst)
        elif kind is not Kind.DIR:  # a directory's own metadata is set after its children
            _fs.set_meta_at(live_fd, name, snap, snap.st_uid, snap.st_gid)

    def _relink(
        self, live_fd: int, snap_fd: int, view_fd: int | None, path: list[str], first: list[str]
    ) -> None:
        """Make live ``path`` a hard link of live ``first`` again (the walk restored both,
        as separate files unless they were still linked)."""
        with contextlib.ExitStack() as stack:
            here = stack.enter_context(_fs.opened_path(live_fd, path[:-1]))
            there = stack.enter_context(_fs.opened_path(live_fd, first[:-1]))
            a = os.stat(path[-1], dir_fd=here, follow_symlinks=False)
            b = os.stat(first[-1], dir_fd=there, follow_symlinks=False)
            if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
                return
            view = None
            if view_fd is not None:
                view = stack.enter_context(_fs.opened_path(view_fd, path[:-1]))
                if _fs.mount_of(view) != self._mount:
                    raise SandboxError(f"refusing {'/'.join(path)}: something is mounted there")
            self._remove(here, view, path[-1], a)
            os.link(first[-1], path[-1], src_dir_fd=there, dst_dir_fd=here, follow_symlinks=False)
            with _fs.opened_path(snap_fd, path[:-1]) as snap_dir:
                was = os.fstat(snap_dir)
            os.utime(here, ns=(was.st_atime_ns, was.st_mtime_ns))  # the walk had set them

    def _remove(self, live_fd: int, view_fd: int | None, name: str, live: os.stat_result) -> None:
        if view_fd is None:
            _fs.remove_tree(live_fd, name)
            return
        if _live_kind(live) is Kind.WHITEOUT:
            self._flush(live_fd, view_fd, name)
        else:
            # A merged directory's lower children are removed through the view too
            # (whiteouts in the upper): overlayfs refuses to remove a directory it still
            # shows entries in, and dropping the upper directory behind its back would
            # leave it a stale dentry. Never across a mount.
            _fs.remove_tree(view_fd, name, self._mount)
        self._drop_whiteout(live_fd, name)

    def _flush(self, live_fd: int, view_fd: int, name: str) -> None:
        """Leave no dentry of ``name`` in the overlay (see the module docstring)."""
        _fs.check_same_mount(view_fd, name, self._mount, name)
        seen = _fs.lstat_at(view_fd, name)
        if seen is not None and stat.S_ISDIR(seen.st_mode):
            _fs.remove_tree(view_fd, name, self._mount)
            return
        transient = f".ringfence-restore-{secrets.token_hex(16)}"
        fd = os.open(transient, _fs.CREATE_FLAGS, 0o600, dir_fd=live_fd)
        try:
            os.fchown(fd, self.owner, self.owner)
        finally:
            os.close(fd)
        os.rename(transient, name, src_dir_fd=view_fd, dst_dir_fd=view_fd)
        os.unlink(name, dir_fd=view_fd)

    def _drop_whiteout(self, live_fd: int, name: str) -> None:
        left = _fs.lstat_at(live_fd, name)
        if left is not None and _live_kind(left) is Kind.WHITEOUT:
            os.unlink(name, dir_fd=live_fd)

    def _create(
        self, live_fd: int, snap_fd: int, name: str, snap: os.stat_result, path: str
    ) -> None:
        create(live_fd, snap_fd, name, snap, path)


def create(dst_fd: int, src_fd: int, name: str, st: os.stat_result, path: str) -> None:
    """Copy the snapshot entry ``name`` (a whole tree for a directory) into ``dst_fd``;
    each entry is its owner's before anything is written into it (a failure part way,
    a full volume, leaves no entry of host root's)."""
    kind = _fs.kind_of(st, path)
    if kind is Kind.FILE:
        with _fs.opened_file(src_fd, name, st) as src:
            dst = os.open(name, _fs.CREATE_FLAGS, 0o600, dir_fd=dst_fd)
            try:
                os.fchown(dst, st.st_uid, st.st_gid)
                _fs.copy_data(src, dst)
                _fs.write_xattrs(dst, _fs.read_xattrs(src))
                _fs.set_meta_fd(dst, st, st.st_uid, st.st_gid)
            finally:
                os.close(dst)
    elif kind is Kind.DIR:
        os.mkdir(name, 0o700, dir_fd=dst_fd)
        os.chown(name, st.st_uid, st.st_gid, dir_fd=dst_fd, follow_symlinks=False)
        with _fs.opened_dir(src_fd, name) as sc, _fs.opened_dir(dst_fd, name) as dc:
            for child in _fs.names(sc):
                child_st = os.stat(child, dir_fd=sc, follow_symlinks=False)
                create(dc, sc, child, child_st, f"{path}/{child}")
            _fs.write_xattrs(dc, _fs.read_xattrs(sc))
            _fs.set_meta_fd(dc, st, st.st_uid, st.st_gid)
    elif kind is not Kind.SKIPPED:
        if kind is Kind.SYMLINK:
            os.symlink(os.readlink(name, dir_fd=src_fd), name, dir_fd=dst_fd)
        else:
            _fs.make_whiteout(dst_fd, name)
        os.chown(name, st.st_uid, st.st_gid, dir_fd=dst_fd, follow_symlinks=False)
        xattrs = _fs.read_xattrs(_fs.proc_path(src_fd, name))
        if xattrs:
            _fs.write_xattrs(_fs.proc_path(dst_fd, name), xattrs)
        _fs.set_meta_at(dst_fd, name, st, st.st_uid, st.st_gid)


def _plan_create(snap_fd: int, name: str, st: os.stat_result, plan: Plan) -> None:
    """Count what ``create`` makes of the snapshot entry ``name`` (a tree: iteratively)."""
    plan.entries += 1
    if stat.S_ISREG(st.st_mode):
        plan.bytes += _pages(st.st_size)
    if not stat.S_ISDIR(st.st_mode):
        return
    first = os.open(name, _fs.DIR_FLAGS, dir_fd=snap_fd)
    stack: list[tuple[int, Iterator[str]]] = [(first, iter(_fs.names(first)))]
    try:  # one open directory per level, as ``_fs.remove_tree``
        while stack:
            fd, remaining = stack[-1]
            for child in remaining:
                child_st = os.stat(child, dir_fd=fd, follow_symlinks=False)
                plan.entries += 1
                if stat.S_ISREG(child_st.st_mode):
                    plan.bytes += _pages(child_st.st_size)
                elif stat.S_ISDIR(child_st.st_mode):
                    child_fd = os.open(child, _fs.DIR_FLAGS, dir_fd=fd)
                    stack.append((child_fd, iter(_fs.names(child_fd))))
                    break
            else:
                os.close(stack.pop()[0])
    finally:
        for fd, _ in stack:
            os.close(fd)


def _same_meta(
    live: os.stat_result, snap: os.stat_result, live_at: int | str, snap_at: int | str
) -> bool:
    """Whether a directory, symlink or whiteout already has the snapshot's metadata (what
    a restore would set: mode, owner, mtime, kept xattrs; atime is not compared)."""
    return (live.st_mode, live.st_uid, live.st_gid, live.st_mtime_ns) == (
        snap.st_mode,
        snap.st_uid,
        snap.st_gid,
        snap.st_mtime_ns,
    ) and _fs.read_xattrs(live_at) == _fs.read_xattrs(snap_at)


def _freed(live: os.stat_result) -> int:
    """Pages removing or rewriting a live entry frees: a file's own (a directory's tree is
    not walked for this: counted as nothing, which errs on the side of refusing)."""
    if stat.S_ISREG(live.st_mode) and live.st_nlink == 1:
        return _pages(live.st_size)
    return 0


def _pages(size: int) -> int:
    return -(-size // _PAGE) * _PAGE


def _left_alone(st: os.stat_result) -> bool:
    """A fifo or socket: not captured, and a rollback leaves it be (a device node, which
    no sandbox can make, is removed instead)."""
    return stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)


def _live_kind(st: os.stat_result) -> Kind:
    try:
        return _fs.kind_of(st, "")
    except SandboxError:
        return Kind.SKIPPED  # a device node: never kept, removed (``_left_alone``)


def _opaque(dir_fd: int, name: str) -> dict[str, bytes]:
    xattrs = _fs.read_xattrs(_fs.proc_path(dir_fd, name))
    return {k: v for k, v in xattrs.items() if k in _OPAQUE}
