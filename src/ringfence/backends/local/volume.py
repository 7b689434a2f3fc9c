"""Each interactive sandbox's volume: a tmpfs the server (root) mounts on the host, holding
every layer the sandbox writes, and nothing any other sandbox can reach.

Layout of one volume (``<runtime_dir>/volumes/i<server pid>/<sandbox>/``)::

    /                     tmpfs, root:<sandbox gid> 0710: only that sandbox's uid traverses it
    workspace/            bound at /home/user        (the sandbox user's host uid, 0755)
    tmp/                  bound at /tmp              (the sandbox root's host uid, 1777)
    layers/<name>/upper   an overlay's upper layer   (the sandbox root's host uid)
    layers/<name>/work    its overlayfs work directory
    lower/<name>          the template directory, idmapped and read-only (see below)
    shared/<n>            a tenant's volume mounted in the sandbox (``volume_binds``)
    project/upper         the project view's upper layer (the sandbox user's host uid)
    project/work          its overlayfs work directory
    project/lower         the host's project directory, idmapped and read-only: its
                          owner's files appear as the sandbox user's (``add_project``)
    snapshots/            root only (0700): the checkpoints (``snapshots.SnapshotStore``)

One tmpfs bounds workspace, tmp, the upper layers and the checkpoints together: its size is
the sandbox's disk limit plus the checkpoint budget (``Config.checkpoint_bytes``). Live
files may use budget bytes no checkpoint holds; a checkpoint that does not fit then fails.

Why the lower layers are idmapped: the template's files belong to host uid 0, which the
sandbox's user namespace does not map, so inside they would belong to "nobody" and even
the sandbox's root could change none of them. An idmapped view shows host uid 0's files as
the sandbox's root uid; it is read-only, nosuid and nodev, so nothing (on the host or in the
sandbox) writes through it: changes are copied up into the sandbox's own upper layer, owned
by its own uid, never by 0.

The parents (``volumes/``, ``volumes/i<pid>/``) are root's, 0711: sandbox uids traverse
them to reach their own volume (bwrap binds its paths as that uid) but cannot list them.
A volume is unmounted (with every mount under it) and removed once its sandbox's cgroup is
gone; volumes of server processes that are gone are swept when a server starts.

Inodes are bounded as well as bytes: tmpfs's ``size`` does not count directories,
symlinks or hard links (each checkpoint re-makes every directory and links every unchanged
file), and its default inode limit is half of RAM in pages. A volume gets one inode per
``BYTES_PER_INODE`` of its size (at least ``MIN_INODES``): a 64 MiB disk limit plus the
default 256 MiB checkpoint budget is 81,920 inodes, about 80 MB of kernel memory at most
(an inode and a dentry are near 1 KiB). A full table is ENOSPC: a checkpoint is then
refused (``SnapshotBudgetExceeded``), a live write fails as on a full disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ringfence.backends.local import _mounts
from ringfence.backends.local.bwrap import WORKSPACE, Overlay, Writable
from ringfence.backends.local.volume_binds import SharedBind, bind_shared
from ringfence.projects import open_dir_path

__all__ = ["Layer", "Volume", "Volumes"]

VOLUMES = "volumes"
BYTES_PER_INODE = 4096  # one inode per page of the volume's size
MIN_INODES = 4096


@dataclass(frozen=True)
class Layer:
    """One overlaid directory of the sandbox's root: ``lower`` (read-only, shared) shown at
    ``target`` with the sandbox's writes in ``upper``."""

    name: str  # "usr", "etc": the target without its slash
    source: str  # the template directory on the host
    target: str  # where the sandbox sees it
    lower: Path  # the idmapped view of ``source`` inside the volume
    upper: Path
    work: Path


@dataclass
class Volume:
    """A mounted volume (see the module docstring). ``close`` unmounts and removes it."""

    path: Path
    owners: tuple[int, ...]  # the host ids its files may belong to (0: the sandbox's root)
    layers: tuple[Layer, ...] = ()
    shared: tuple[SharedBind, ...] = ()  # tenants' volumes, by target
    project: Layer | None = None  # the project view, when the sandbox has one
    _mounted: bool = field(default=True, repr=False)

    @property
    def workspace(self) -> Path:
        return self.path / "workspace"

    @property
    def tmp(self) -> Path:
        return self.path / "tmp"

    @property
    def snapshots(self) -> Path:
        return self.path / "snapshots"

    def planted_link(self, target: str) -> str | None:
        """The first part of ``target`` (a path inside the sandbox) that is a symlink in the
        sandbox's own files (its workspace, ``/tmp``, its upper layers: what a restore or a
        fork put there, written by the sandbox), or None. bwrap follows a link on its way
        to a mount's target, so a link planted there (``/home/user/data ->
        /newroot/...``, ``../../oldroot/...``) would carry a volume or a project view to a
        place its target's checks never saw. Parts below one that is missing are bwrap's
        to make, fresh. The template's own layers are the server's and are not walked."""
        areas = [(WORKSPACE, self.workspace), ("/tmp", self.tmp)]
        areas += [(layer.target, layer.upper) for layer in self.layers]
        found = [(top, host) for top, host in areas if target.startswith(top.rstrip("/") + "/")]
        if not found:
            return None
        top, host = max(found, key=lambda area: len(area[0]))
        names = [name for name in target[len(top) :].split("/") if name]
        shown = top.rstrip("/")
        fd = os.open(host, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for name in names:
                shown = f"{shown}/{name}"
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    return None
                if stat.S_ISLNK(info.st_mode):
                    return shown
                if not stat.S_ISDIR(info.st_mode):
                    return None  # bwrap cannot mount there either: it says so
                below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                | os.O_CLOEXEC, dir_fd=fd)  # fmt: skip
                os.close(fd)
                fd = below
        finally:
            os.close(fd)
        return None

    def writable(self) -> Writable:
        """Its paths as ``bwrap_args`` takes them."""
        overlays = {
            layer.target: Overlay(str(layer.lower), str(layer.upper), str(layer.work))
            for layer in self.layers
        }
        shared = tuple((bind.view, bind.target, bind.read_only) for bind in self.shared)
        project = None
        if self.project is not None:
            layer = self.project
            project = (layer.target, Overlay(str(layer.lower), str(layer.upper), str(layer.work)))
        return Writable(str(self.workspace), str(self.tmp), overlays, shared, project)

    def close(self) -> None:
        """Unmount it (and the views under it) and remove its mount point. Only once no
        process of the sandbox is left (its cgroup is gone). Safe to call twice.

        Raises:
            OSError: it could not be unmounted.
        """
        if self._mounted:
            _mounts.unmount(str(self.path))
            self._mounted = False
        with contextlib.suppress(FileNotFoundError):
            self.path.rmdir()


class Volumes:
    """Makes the volumes of one server process (root only), under ``runtime_dir``."""

    def __init__(self, runtime_dir: Path) -> None:
        """Sweep the volumes of server processes that are gone.

        Raises:
            OSError: the directories cannot be made.
        """
        parent = runtime_dir / VOLUMES
        _traversable_dir(parent)
        sweep_stale(parent)
        self._dir = parent / f"i{os.getpid()}"
        _traversable_dir(self._dir)
        self._userns: dict[int, int] = {}  # root uid -> the namespace its views map with
        self._pairs: dict[tuple[int, int], int] = {}  # (root, user) -> volumes' namespace

    def create(
        self,
        name: str,
        size: int,
        overlays: Iterable[tuple[str, str]],
        root_uid: int,
        user_uid: int,
        shared: Iterable[tuple[Path, str, bool]] = (),
    ) -> Volume:
        """Mount a volume of ``size`` bytes for sandbox ``name``, with an upper layer for
        each ``(source, target)`` of ``overlays``. ``root_uid``: the host uid of the
        sandbox's root (owns the layers and tmp); ``user_uid``: of its user (owns the
        workspace); today one uid is both. ``shared``: tenants' volumes, each ``(host
        directory, target, read_only)``, shown through views owned by those two uids.

        Raises:
            OSError: a mount or a directory failed (nothing is left mounted then).
        """
        # Made again if another ``Volumes`` of this process removed it (closing, empty).
        _traversable_dir(self._dir)
        path = self._dir / name
        path.mkdir(mode=0o700)
        try:
            inodes = max(MIN_INODES, size // BYTES_PER_INODE)
            _mounts.mount_tmpfs(str(path), size, 0o710, gid=root_uid, inodes=inodes)
        except OSError:
            path.rmdir()
            raise
        volume = Volume(path, tuple(dict.fromkeys((root_uid, user_uid))))
        try:
            volume.layers = self._populate(volume, overlays, root_uid, user_uid)
            shared = tuple(shared)
            if shared:
                userns = self._userns_for_pair(root_uid, user_uid)
                volume.shared = bind_shared(volume.path, shared, userns)
        except BaseException:
            volume.close()
            raise
        return volume

    def _populate(
        self, volume: Volume, overlays: Iterable[tuple[str, str]], root_uid: int, user_uid: int
    ) -> tuple[Layer, ...]:
        _owned_dir(volume.workspace, 0o755, user_uid)
        _owned_dir(volume.tmp, 0o1777, root_uid)
        volume.snapshots.mkdir(mode=0o700)  # root only (SnapshotStore checks it)
        layers = []
        for source, target in overlays:
            name = target.strip("/").replace("/", "-")
            base = volume.path / "layers" / name
            lower = volume.path / "lower" / name
            for directory in (base.parent, base, lower.parent, lower):
                _traversable_dir(directory)
            mode = os.stat(source).st_mode & 0o7777
            # The upper's root is the merged directory's root: same mode as the template's.
            _owned_dir(base / "upper", mode, root_uid)
            _owned_dir(base / "work", 0o700, root_uid)
            _mounts.idmapped_view(source, str(lower), self._userns_for(root_uid))
            layers.append(Layer(name, source, target, lower, base / "upper", base / "work"))
        return tuple(layers)

    def add_project(self, volume: Volume, source: Path, target: str, root_uid: int,
                    user_uid: int) -> None:  # fmt: skip
        """Give ``volume`` a project view of the host directory ``source`` shown at
        ``target``: an idmapped, read-only, nosuid, nodev view of it (its owner's ids
        appear as the sandbox user's, ``user_uid``; other owners' files as nobody) below
        an upper layer of the sandbox's own. ``source`` is opened from ``/`` one component
        at a time without following links (a component swapped for a link fails here), and
        that descriptor is what is cloned: no path is looked up twice.

        Raises:
            OSError: it cannot be opened or mounted (the caller closes the volume).
        """
        source_fd = open_dir_path(str(source))
        try:
            st = os.fstat(source_fd)
            base = volume.path / "project"
            lower = base / "lower"
            _traversable_dir(base)
            _traversable_dir(lower)
            # The upper's root is the merged directory's root: the host directory's mode.
            _owned_dir(base / "upper", stat.S_IMODE(st.st_mode) & 0o777, user_uid)
            _owned_dir(base / "work", 0o700, root_uid)
            userns = _mounts.userns_mappings({st.st_uid: user_uid}, gids={st.st_gid: user_uid})
            try:
                _mounts.idmapped_view(source_fd, str(lower), userns)
            finally:
                os.close(userns)  # the mount holds the namespace
        finally:
            os.close(source_fd)
        volume.project = Layer("project", str(source), target, lower, base / "upper",
                               base / "work")  # fmt: skip

    def _userns_for(self, root_uid: int) -> int:
        # One namespace per uid for the server's life: making one costs a process start.
        if root_uid not in self._userns:
            self._userns[root_uid] = _mounts.userns_mapping(root_uid)
        return self._userns[root_uid]

    def _userns_for_pair(self, root_uid: int, user_uid: int) -> int:
        """What tenants' volumes are shown with: on-disk 0 and 1000 as the two uids."""
        key = (root_uid, user_uid)
        if key not in self._pairs:
            # One uid for both (never as root inside, where volumes are mounted): the user's.
            ids = {0: root_uid, 1000: user_uid} if root_uid != user_uid else {1000: user_uid}
            self._pairs[key] = _mounts.userns_mappings(ids)
        return self._pairs[key]

    def close(self) -> None:
        """Drop the id-mapping namespaces, and this process's volume directory if it is
        empty (another ``Volumes`` of this process may still have volumes in it)."""
        for fd in [*self._userns.values(), *self._pairs.values()]:
            os.close(fd)
        self._userns.clear()
        self._pairs.clear()
        with contextlib.suppress(OSError):
            self._dir.rmdir()


def _traversable_dir(path: Path) -> None:
    """``path`` a directory of ours that every uid may traverse but not list (0711),
    whatever the umask."""
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o711)


def _owned_dir(path: Path, mode: int, uid: int) -> None:
    path.mkdir(mode=0o700)
    os.chown(path, uid, uid)
    os.chmod(path, mode)


def sweep_stale(parent: Path) -> None:
    """Unmount and remove the volumes of server processes that are gone (their sandboxes
    died with them)."""
    for instance in parent.iterdir():
        pid = instance.name[1:]
        if not (instance.name.startswith("i") and pid.isdigit()) or Path("/proc", pid).exists():
            continue
        for point in _mounts.mounts_under(str(instance)):
            with contextlib.suppress(OSError):
                _mounts.unmount(point)
        if not _mounts.mounts_under(str(instance)):  # never remove files of a mounted volume
            shutil.rmtree(instance, ignore_errors=True)
