"""``SnapshotStore``: one sandbox's checkpoints on its volume."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path, PurePosixPath

from ringfence.backends._interactive import Checkpoint
from ringfence.backends.local.snapshots import _fs
from ringfence.backends.local.snapshots._creds import run_as
from ringfence.backends.local.snapshots._export import export_snapshot
from ringfence.backends.local.snapshots._fs import Owners
from ringfence.backends.local.snapshots._mapped import Pids, shared_writable
from ringfence.backends.local.snapshots._restore import RestoreIncomplete, Restorer
from ringfence.backends.local.snapshots._take import Taken, Taker, coarse_now_ns
from ringfence.errors import CheckpointNotFound, SandboxError, SnapshotBudgetExceeded

_OVERLAYFS_MAGIC = 0x794C7630


DEFAULT_ENTRIES = 200_000
"""Entries all of a sandbox's checkpoints may make together (about 0.5-1 KiB of the
server's kernel memory each on tmpfs: an inode and a dentry, or a dentry for a link)."""


@dataclass(frozen=True)
class Budget:
    """How much one sandbox's checkpoints may hold: how many, how many bytes in all (a
    file shared by several checkpoints counts once) and how many entries in all: every
    directory, symlink, whiteout, copy and hard link a checkpoint makes is a name (and
    most an inode) on the volume's tmpfs, kernel memory charged to the server that no
    byte count sees, so each counts, shared or not."""

    count: int
    bytes: int
    entries: int = DEFAULT_ENTRIES


@dataclass(frozen=True)
class OverlayView:
    """Where the sandbox sees an upper layer merged: ``path`` inside the root of
    ``proc_root`` (``/proc/<its init>/root``), walked one component at a time without
    following a link; the directory reached must be an overlayfs."""

    proc_root: Path
    path: PurePosixPath


@dataclass
class _Held:
    checkpoint: Checkpoint
    taken: Taken


class SnapshotStore:
    """The checkpoints of one sandbox: incremental snapshots of its layers under ``root``
    (on the same filesystem as the layers, only root can enter it, never mounted into any
    sandbox). ``layers`` maps a layer's name to its live directory; ``owners`` are the
    sandbox's host ids (index 0: the id its root maps to); ``key`` seals its exports.

    Every method expects the sandbox frozen (``Cgroup.frozen``) while it reads or writes
    the live layers (``take``, ``restore``); none is safe to call concurrently with another.
    """

    def __init__(
        self,
        root: Path,
        layers: Mapping[str, Path],
        owners: Sequence[int],
        budget: Budget,
        key: bytes,
        pids: Pids | None = None,
    ) -> None:
        """``pids`` gives the sandbox's processes (its cgroup's, read while frozen): files
        they map shared and writable are treated as changed by ``take`` and ``restore``
        (writes through such a mapping move no ctime: ``_mapped``)."""
        for name in layers:
            _fs.check_name(name, ())
        self.layers = dict(layers)
        self.owners = Owners(tuple(owners))
        self.budget = budget
        self._key = key  # seals exports (``populate`` checks it)
        self._pids = pids
        self._root = _private_dir(root)
        self._held: dict[str, _Held] = {}  # oldest first
        self._blobs: dict[int, list[int]] = {}  # snapshot inode -> [size, checkpoints using it]

    @property
    def used_bytes(self) -> int:
        return sum(size for size, _ in self._blobs.values())

    @property
    def used_entries(self) -> int:
        """The names all checkpoints held made on the volume (see ``Budget``)."""
        return sum(held.taken.entries for held in self._held.values())

    def take(self) -> Checkpoint:
        """Snapshot every layer (incrementally). The sandbox must be frozen.

        Raises:
            SnapshotBudgetExceeded: the count or bytes of the budget would be passed.
            SandboxError: a layer holds what no sandbox can make (a device node, a file
                of a foreign owner, a mount): nothing is captured then.
        """
        if len(self._held) >= self.budget.count:
            raise SnapshotBudgetExceeded(
                f"this sandbox holds {len(self._held)} checkpoints, its budget: delete one"
            )
        floor = coarse_now_ns()
        previous = next(reversed(self._held.values()), None)
        taker = Taker(
            self.owners,
            previous.taken.live if previous else None,
            self.budget.bytes - self.used_bytes,
            floor,
            entries_room=self.budget.entries - self.used_entries,
        )
        taker.mapped = shared_writable(self._pids)
        checkpoint_id = "ck" + secrets.token_hex(8)
        os.mkdir(checkpoint_id, 0o700, dir_fd=self._root)
        try:
            with contextlib.ExitStack() as stack:
                snap_fd = stack.enter_context(_fs.opened_dir(self._root, checkpoint_id))
                prev_fd = None
                if previous is not None:
                    prev_fd = stack.enter_context(
                        _fs.opened_dir(self._root, previous.checkpoint.id)
                    )
                for name, live in self.layers.items():
                    with _open_layer(live) as live_fd:
                        taker.layer(name, live_fd, snap_fd, prev_fd)
        except BaseException as exc:
            _fs.remove_tree(self._root, checkpoint_id)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise SnapshotBudgetExceeded("the sandbox's volume is full") from exc
            if isinstance(exc, OSError):
                raise SandboxError(f"the checkpoint failed: {exc}") from exc
            raise
        taken = taker.taken
        for ino, size in taken.blobs.items():
            self._blobs.setdefault(ino, [size, 0])[1] += 1
        checkpoint = Checkpoint(
            id=checkpoint_id, created_at=datetime.now(UTC), files=taken.files, bytes=taken.added
        )
        self._held[checkpoint_id] = _Held(checkpoint, taken)
        return checkpoint

    def close(self) -> None:
        """Let go of the snapshot directory's descriptor (it keeps the volume's tmpfs
        alive once unmounted). Idempotent; the store is unusable afterwards."""
        fd, self._root = self._root, -1
        if fd >= 0:
            os.close(fd)

    def list(self) -> list[Checkpoint]:
        """The checkpoints held, oldest first."""
        return [held.checkpoint for held in self._held.values()]

    def skipped(self, checkpoint_id: str) -> tuple[str, ...]:
        """The fifos and sockets ``checkpoint_id`` did not capture ("layer/path")."""
        return tuple(self._get(checkpoint_id).taken.skipped)

    def delete(self, checkpoint_id: str) -> None:
        """Free a checkpoint. Raises ``CheckpointNotFound``."""
        held = self._get(checkpoint_id)
        _fs.remove_tree(self._root, checkpoint_id)
        del self._held[checkpoint_id]
        for ino in held.taken.blobs:
            entry = self._blobs[ino]
            entry[1] -= 1
            if entry[1] == 0:
                del self._blobs[ino]

    def restore(
        self, checkpoint_id: str, overlay_view: Mapping[str, OverlayView] | None = None
    ) -> None:
        """Make every layer's content what it was at ``checkpoint_id``, in place. The
        sandbox must be frozen. ``overlay_view`` names, for each upper layer whose overlay
        is mounted, where the sandbox sees it merged (see ``_restore``); a layer missing
        from it is changed directly (a plain bind, or an upper with nothing mounted).

        Everything that can be checked is checked before the first write: each view is
        its layer's overlay, no name the restore touches has a mount at or below it in
        the sandbox, the volume has the room and inodes the restore will take.

        Raises:
            CheckpointNotFound: no such checkpoint (nothing changed).
            SandboxError: a check above failed: nothing was changed, the sandbox may run on.
            SnapshotBudgetExceeded: the volume lacks the room or inodes (nothing changed).
            RestoreIncomplete: the files could not all be written: they are partly
                restored, and the sandbox must not run on (kill it, or restart it on the
                checkpoint). Never thaw it then.
        """
        held = self._get(checkpoint_id)
        views = dict(overlay_view or {})
        unknown = set(views) - set(self.layers)
        if unknown:
            raise SandboxError(f"no such layer to restore through an overlay: {sorted(unknown)}")
        root = self.owners.ids[0]
        with contextlib.ExitStack() as stack:
            try:
                mapped = shared_writable(self._pids)
                restorer = Restorer(held.taken.live, held.taken.links, root, mapped)
                snap_root = stack.enter_context(_fs.opened_dir(self._root, checkpoint_id))
                opened: dict[str, tuple[int, int, int | None]] = {}
                for name in self.layers:
                    live_fd = stack.enter_context(_open_layer(self.layers[name]))
                    snap_fd = stack.enter_context(_fs.opened_dir(snap_root, name))
                    view_fd = None
                    if name in views:
                        view_fd = stack.enter_context(_open_view(views[name]))
                        _check_view(live_fd, view_fd, root, name)
                    opened[name] = (live_fd, snap_fd, view_fd)
                self._check_plan(restorer, opened, views)
            except OSError as exc:
                raise SandboxError(
                    f"the rollback to {checkpoint_id} was refused, nothing was changed: {exc}"
                ) from exc
            try:
                for name, (live_fd, snap_fd, view_fd) in opened.items():
                    if view_fd is None:
                        restorer.layer(live_fd, snap_fd, None, name)
                overlaid = {name: fds for name, fds in opened.items() if fds[2] is not None}
                if overlaid:
                    # Names are made through overlays as the sandbox's root (_creds): one
                    # thread with its ids for every overlaid layer.
                    run_as(root, root, partial(_restore_overlays, restorer, overlaid))
            except Exception as exc:
                raise RestoreIncomplete(
                    f"the rollback to {checkpoint_id} failed part way ({exc}): the sandbox's "
                    "files are partly restored, it must not run on (restart it on the "
                    "checkpoint)"
                ) from exc

    def _check_plan(
        self,
        restorer: Restorer,
        opened: Mapping[str, tuple[int, int, int | None]],
        views: Mapping[str, OverlayView],
    ) -> None:
        """Refuse (``SandboxError``, nothing written) a restore the volume has no room for
        or whose names have a mount at or below them in the sandbox. The room is the net
        need (copies less the live files they replace): a restore frees a directory's
        names before it fills it, so its peak is near that, though not bounded by it (a
        failure then is ``RestoreIncomplete``, never a root file: entries are owned first)."""
        needed, entries = 0, 0
        for name, (live_fd, snap_fd, _) in opened.items():
            plan = restorer.plan(live_fd, snap_fd, name)
            needed += plan.bytes - plan.freed
            entries += plan.entries
            if name in views:
                mounted = _mounted_under(views[name])
                for touched in plan.touched:
                    if touched in mounted:
                        where = views[name].path.joinpath(*touched)
                        raise SandboxError(
                            f"the rollback was refused, nothing was changed: {where} in the "
                            "sandbox has something mounted at or below it"
                        )
        if not opened:
            return
        fs = os.fstatvfs(next(iter(opened.values()))[0])
        if needed > fs.f_bavail * fs.f_frsize or entries > fs.f_favail:
            raise SnapshotBudgetExceeded(
                f"the rollback was refused, nothing was changed: it needs {needed} bytes and "
                f"{entries} inodes, the sandbox's volume has {fs.f_bavail * fs.f_frsize} and "
                f"{fs.f_favail} left"
            )

    def export(self, checkpoint_id: str, target: Path, context: bytes = b"") -> None:
        """Persist ``checkpoint_id`` as a sealed export in ``target`` (a new directory, off
        the volume: plain copies, no links into it), for ``populate`` with the same
        ``context`` (what it belongs to: the seal binds it).

        Raises:
            CheckpointNotFound: no such checkpoint.
            SandboxError: ``target`` exists or cannot be written.
        """
        with self.opened(checkpoint_id) as snap_fd:
            try:
                export_snapshot(snap_fd, list(self.layers), self.owners, self._key, target, context)
            except OSError as exc:
                raise SandboxError(f"cannot export {checkpoint_id} to {target}: {exc}") from exc

    @contextlib.contextmanager
    def opened(self, checkpoint_id: str) -> Iterator[int]:
        """The snapshot directory of ``checkpoint_id`` (read it, never write it)."""
        self._get(checkpoint_id)
        with _fs.opened_dir(self._root, checkpoint_id) as fd:
            yield fd

    def _get(self, checkpoint_id: str) -> _Held:
        held = self._held.get(checkpoint_id)
        if held is None:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id!r} in this sandbox")
        return held


def _private_dir(root: Path) -> int:
    """Open (making it if needed) the snapshot root: a directory of root's, mode 0700."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    fd = os.open(root, _fs.DIR_FLAGS)
    st = os.fstat(fd)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
        os.close(fd)
        raise SandboxError(f"{root} must belong to root, mode 0700, to hold snapshots")
    return fd


@contextlib.contextmanager
def _open_layer(path: Path) -> Iterator[int]:
    try:
        fd = os.open(path, _fs.DIR_FLAGS)
    except OSError as exc:
        raise SandboxError(f"cannot open the layer {path}: {exc.strerror}") from exc
    try:
        yield fd
    finally:
        os.close(fd)


def _restore_overlays(
    restorer: Restorer, opened: Mapping[str, tuple[int, int, int | None]]
) -> None:
    for name, (live_fd, snap_fd, view_fd) in opened.items():
        restorer.layer(live_fd, snap_fd, view_fd, name)


@contextlib.contextmanager
def _open_view(view: OverlayView) -> Iterator[int]:
    """The merged directory ``view`` names (an overlayfs), reached without following a
    link; ``SandboxError`` if it cannot be. Only the walk is guarded: an error of the
    caller's, inside the ``with``, passes unchanged."""
    try:
        fd = os.open(view.proc_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"cannot reach the sandbox's root: {exc.strerror}") from exc
    try:
        try:
            for part in view.path.parts:
                if part == "/":
                    continue
                _fs.check_name(part, ())
                child = os.open(part, _fs.DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            magic = _fs_magic(fd)
        except OSError as exc:
            raise SandboxError(f"cannot reach {view.path} in the sandbox: {exc.strerror}") from exc
        if magic != _OVERLAYFS_MAGIC:
            raise SandboxError(f"{view.path} in the sandbox is not its overlay")
        yield fd
    finally:
        os.close(fd)


def _mounted_under(view: OverlayView) -> frozenset[tuple[str, ...]]:
    """Every name under ``view.path`` (as components below it) that is a mount point in
    the sandbox's mount namespace, or above one: what a restore must not touch."""
    # /proc/<pid>/root's mounts are /proc/<pid>/mountinfo; the host's own root, ours
    root = view.proc_root
    mountinfo = Path("/proc/self/mountinfo") if root == Path("/") else root.parent / "mountinfo"
    try:
        lines = mountinfo.read_text(errors="surrogateescape").splitlines()
    except OSError as exc:
        raise SandboxError(f"cannot read the sandbox's mounts ({mountinfo}): {exc}") from exc
    base = PurePosixPath(view.path)
    found: set[tuple[str, ...]] = set()
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        point = PurePosixPath(_unescape(fields[4]))
        if point == base or base not in point.parents:
            continue
        below = point.relative_to(base).parts
        found.update(below[:n] for n in range(1, len(below) + 1))
    return frozenset(found)


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _check_view(live_fd: int, view_fd: int, owner: int, name: str) -> None:
    """Fail closed unless ``view_fd`` is the overlay whose upper is ``live_fd``: a probe
    made in the upper must show through it (and is removed through it)."""
    probe = f".ringfence-probe-{secrets.token_hex(16)}"
    fd = os.open(probe, _fs.CREATE_FLAGS, 0o600, dir_fd=live_fd)
    try:
        os.fchown(fd, owner, owner)
    except OSError:
        os.unlink(probe, dir_fd=live_fd)  # never left behind as root's
        raise
    finally:
        os.close(fd)
    seen = _fs.lstat_at(view_fd, probe)
    if seen is None:
        os.unlink(probe, dir_fd=live_fd)  # the overlay never looked it up: no dentry left
        raise SandboxError(f"the overlay given for the layer {name!r} is not over it")
    os.unlink(probe, dir_fd=view_fd)


_libc = ctypes.CDLL(None, use_errno=True)


def _fs_magic(fd: int) -> int:
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type is its first long
    if _libc.fstatfs(fd, buf) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return int.from_bytes(buf.raw[:8], "little")
