"""``SnapshotStore``: one sandbox's checkpoints on its volume."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
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
from ringfence.backends.local.snapshots._restore import Restorer
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
    ) -> None:
        for name in layers:
            _fs.check_name(name, ())
        self.layers = dict(layers)
        self.owners = Owners(tuple(owners))
        self.budget = budget
        self._key = key  # seals exports (``populate`` checks it)
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

        Raises:
            CheckpointNotFound: no such checkpoint.
            SandboxError: a view is not the overlay of its layer (nothing was changed), or
                the files could not all be written: then they are partly restored, and the
                sandbox must not run on (kill it, or restart it on the checkpoint).
        """
        held = self._get(checkpoint_id)
        views = dict(overlay_view or {})
        unknown = set(views) - set(self.layers)
        if unknown:
            raise SandboxError(f"no such layer to restore through an overlay: {sorted(unknown)}")
        restorer = Restorer(held.taken.live, held.taken.links, self.owners.ids[0])
        root = self.owners.ids[0]
        try:
            with _fs.opened_dir(self._root, checkpoint_id) as snap_root:
                for name in self.layers:
                    if name not in views:
                        self._restore_layer(restorer, snap_root, name, None)
                if views:
                    # Names are made through overlays as the sandbox's root (_creds): one
                    # thread with its ids for every overlaid layer.
                    run_as(root, root, partial(self._restore_overlays, restorer, snap_root, views))
        except OSError as exc:
            raise SandboxError(
                f"the rollback to {checkpoint_id} failed part way ({exc}): the sandbox's files "
                "are partly restored, it must not run on (restart it on the checkpoint)"
            ) from exc

    def _restore_overlays(
        self, restorer: Restorer, snap_root: int, views: Mapping[str, OverlayView]
    ) -> None:
        for name, view in views.items():
            self._restore_layer(restorer, snap_root, name, view)

    def _restore_layer(
        self, restorer: Restorer, snap_root: int, name: str, view: OverlayView | None
    ) -> None:
        with contextlib.ExitStack() as stack:
            live_fd = stack.enter_context(_open_layer(self.layers[name]))
            snap_fd = stack.enter_context(_fs.opened_dir(snap_root, name))
            view_fd = None
            if view is not None:
                view_fd = stack.enter_context(_open_view(view))
                _check_view(live_fd, view_fd, self.owners.ids[0], name)
            restorer.layer(live_fd, snap_fd, view_fd, name)

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


@contextlib.contextmanager
def _open_view(view: OverlayView) -> Iterator[int]:
    fd = os.open(view.proc_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in view.path.parts:
            if part == "/":
                continue
            _fs.check_name(part, ())
            child = os.open(part, _fs.DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        if _fs_magic(fd) != _OVERLAYFS_MAGIC:
            raise SandboxError(f"{view.path} in the sandbox is not its overlay")
        yield fd
    except OSError as exc:
        raise SandboxError(f"cannot reach {view.path} in the sandbox: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _check_view(live_fd: int, view_fd: int, owner: int, name: str) -> None:
    """Fail closed unless ``view_fd`` is the overlay whose upper is ``live_fd``: a probe
    made in the upper must show through it (and is removed through it)."""
    probe = f".ringfence-probe-{secrets.token_hex(16)}"
    fd = os.open(probe, _fs.CREATE_FLAGS, 0o600, dir_fd=live_fd)
    try:
        os.fchown(fd, owner, owner)
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
