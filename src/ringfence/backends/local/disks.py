"""Where tenants' volumes live on the server's host: one ext4 filesystem image per volume,
loop-mounted by the server (root only), its size the volume's quota.

Layout (``<data_dir>/volumes/``, root's, 0700: no other host user reaches a volume)::

    images/<volume id>.img    the filesystem: a sparse file, so the host's disk holds only
                              what was written (blocks freed inside are punched out again:
                              ``discard``), never more than the quota; what the quotas may
                              still take is counted (``room``) so the service never promises
                              more than the disk has
    mnt/<volume id>/          where the server mounts it (nosuid, nodev, noatime)

Why an image per volume: the quota must hold against a hostile sandbox writing as fast as it
can, and the host's own filesystem has no quotas to give (this machine's ext4 root has no
project quota feature, and tmpfs here has none either). A filesystem of exactly the quota's
size cannot hold more: a write past it fails inside the sandbox with ENOSPC, and the host
loses at most the quota. ext4's journal and tables take a part of it (32 MiB of a 1 GiB
volume): a volume's ``used_bytes`` counts them, so it never claims more room than it has.

Whose files: the filesystem stores the ids sandboxes see (0 their root, 1000 their user; the
root directory is 1000's), never a host uid of a sandbox. A sandbox is shown a volume
through an idmapped view (``_mounts.idmapped_view``) that maps those two ids to its own
host uids while it runs: nothing on disk changes owner when another sandbox mounts it.

One server per data directory (design.md 10.15): at start, mounts left by a server that
died are unmounted (a volume is then mounted again on its first use). A filesystem can
outlive its mount here while another mount namespace holds a copy (a tool that bound ``/``
recursively while it was mounted): its loop device stays, and is mounted again as it is
(the kernel shares the one filesystem); an image under two loop devices, two filesystems
writing one file, is never mounted (fail closed).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
import time
from collections import OrderedDict
from pathlib import Path

from ringfence.backends.local import _mounts
from ringfence.errors import SandboxError

__all__ = ["MAX_MOUNTED", "NEUTRAL_ROOT", "NEUTRAL_USER", "VolumeDisks"]

NEUTRAL_ROOT = 0  # on disk: the sandbox root's files
NEUTRAL_USER = 1000  # on disk: the sandbox user's files (and the volume's root directory)
_ID = re.compile(r"vo[0-9a-f]{20}")
_MOUNT_OPTIONS = "nosuid,nodev,noatime,discard"
_SECONDS = 30.0
MAX_MOUNTED = 64  # host mounts of volumes kept at once
_RUNDOWN_SECONDS = 2.0  # how long a loop device being detached may take to go
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class VolumeDisks:
    """The volumes of one data directory. Root only: ``VolumeDisks.open`` says why not.
    Thread-safe (the service calls it from worker threads)."""

    def __init__(self, root: Path, max_mounted: int = MAX_MOUNTED) -> None:
        """``max_mounted``: host mounts kept at once (see ``mount``)."""
        self._root = root
        self._images = root / "images"
        self._points = root / "mnt"
        self._lock = threading.Lock()
        self._max_mounted = max_mounted
        self._mounted: OrderedDict[str, None] = OrderedDict()  # least recently used first

    @classmethod
    def open(cls, data_dir: Path) -> VolumeDisks:
        """The volumes under ``data_dir``, with the mounts a dead server left unmounted.

        Raises:
            SandboxError: this host cannot keep volumes (not root, no ``mkfs.ext4`` or
                ``mount``), or a stale mount cannot be removed (the message says why).
        """
        if os.geteuid() != 0:
            raise SandboxError("volumes need the server to run as root (it mounts them)")
        for tool in ("mkfs.ext4", "mount", "umount", "losetup"):
            if shutil.which(tool, path=_SYSTEM_PATH) is None:
                raise SandboxError(f"volumes need {tool} (in {_SYSTEM_PATH})")
        disks = cls(data_dir / "volumes")
        if disks._points.is_dir():  # made by the first create: nothing is read before
            for point in _mounts.mounts_under(str(disks._points)):
                try:  # not detached: a volume still busy must not be mounted again beside it
                    _run(["umount", point], f"unmounting a stale volume at {point}")
                except SandboxError as exc:
                    raise SandboxError(
                        f"{exc.message}: stop what uses it, then start again"
                    ) from exc
        return disks

    def _prepare(self) -> None:
        for directory in (self._root, self._images, self._points):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(directory, 0o700)

    def create(self, volume_id: str, quota: int) -> None:
        """Make the filesystem of a new volume of ``quota`` bytes (empty, its root the
        sandbox user's). Raises ``SandboxError`` (nothing is left then)."""
        image = self._image(volume_id)
        self._prepare()
        with open(image, "xb") as made:  # never over an existing volume's
            os.fchmod(made.fileno(), 0o600)
            made.truncate(quota)
        try:
            _run(
                ["mkfs.ext4", "-q", "-F", "-m", "0",
                 "-E", f"root_owner={NEUTRAL_USER}:{NEUTRAL_USER}", str(image)],
                f"making volume {volume_id}",
            )  # fmt: skip
        except BaseException:
            image.unlink()
            raise

    def room(self) -> tuple[int, int]:
        """``(free, promised)``: the bytes free on the disk holding the images (less the
        blocks the filesystem reserves for root: never counted on), and the bytes the
        volumes may still take of it (each image's quota less what it holds already:
        images are sparse)."""
        self._prepare()
        found = os.statvfs(self._images)
        promised = 0
        with os.scandir(self._images) as images:
            for image in images:
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    info = image.stat(follow_symlinks=False)
                    promised += max(0, info.st_size - info.st_blocks * 512)
        return found.f_bavail * found.f_frsize, promised

    def mount(self, volume_id: str) -> Path:
        """Where the volume's files are on the host (mounted now if it was not). Only
        root reaches them there. At most ``max_mounted`` stay mounted: the least recently
        used is unmounted first (a sandbox's view, or a file call under way, keeps its
        filesystem alive, and the next mount shares it: ``_source``), so a host with many
        volumes does not keep a mount, a loop device and a journal thread for each.

        Raises:
            SandboxError: it cannot be mounted (its image is missing or damaged, or more
                than one loop device backs it).
        """
        point = self._points / volume_id
        with self._lock:
            if volume_id in self._mounted:
                self._mounted.move_to_end(volume_id)
                return point
            while len(self._mounted) >= self._max_mounted:
                self._unmount(next(iter(self._mounted)))
            image = self._image(volume_id)
            if not image.exists():
                raise SandboxError(f"volume {volume_id} has no filesystem on this server")
            point.mkdir(mode=0o700, exist_ok=True)
            deadline = time.monotonic() + _RUNDOWN_SECONDS
            while True:
                source = self._source(volume_id, image)
                options = f"loop,{_MOUNT_OPTIONS}" if source == str(image) else _MOUNT_OPTIONS
                try:
                    _run(
                        ["mount", "-t", "ext4", "-o", options, source, str(point)],
                        f"mounting volume {volume_id}",
                    )
                    break
                except SandboxError:
                    # A loop device whose filesystem was just let go is detached by the
                    # kernel a moment later, and cannot be opened meanwhile: look again.
                    if source == str(image) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            self._mounted[volume_id] = None
        return point

    def _attached(self, volume_id: str, image: Path) -> list[str]:
        """The loop devices backing ``image`` now (left by a server that died while
        something else still held its filesystem: another mount namespace's copy)."""
        found = _run(["losetup", "-j", str(image)], "checking a volume's loop device")
        return [line.split(":", 1)[0] for line in found.splitlines() if line.strip()]

    def _source(self, volume_id: str, image: Path) -> str:
        """What to mount: the image (through a new loop device), or the one loop device
        already backing it, whose filesystem the kernel then shares (one superblock). Two
        loop devices over one image would be two filesystems writing one file: refused.

        Raises:
            SandboxError: more than one loop device backs the image.
        """
        attached = self._attached(volume_id, image)
        if len(attached) > 1:
            raise SandboxError(
                f"volume {volume_id} is attached to {len(attached)} loop devices: it is not "
                "mounted again until they are gone"
            )
        return attached[0] if attached else str(image)

    def usage(self, volume_id: str) -> int:
        """Bytes in use in the volume (files and the filesystem's own), mounting it.
        Raises ``SandboxError``."""
        found = os.statvfs(self.mount(volume_id))
        return (found.f_blocks - found.f_bfree) * found.f_frsize

    def delete(self, volume_id: str) -> None:
        """Unmount the volume and remove its filesystem (every file in it). Only once no
        sandbox mounts it. Safe to call for a volume that is gone. Raises ``SandboxError``."""
        with self._lock:
            self._unmount(volume_id)
            self._image(volume_id).unlink(missing_ok=True)

    def close(self) -> None:
        """Unmount every volume (at the server's stop; files stay)."""
        with self._lock:
            for volume_id in list(self._mounted):
                with contextlib.suppress(SandboxError):
                    self._unmount(volume_id)

    def _unmount(self, volume_id: str) -> None:
        point = self._points / volume_id
        if volume_id in self._mounted or _mounts.mounts_under(str(point)):
            try:
                _run(["umount", str(point)], f"unmounting volume {volume_id}")
            except SandboxError:
                # Busy (a file call under way): detached, it goes when the last user does.
                try:
                    _mounts.unmount(str(point))
                except OSError as exc:
                    raise SandboxError(f"unmounting volume {volume_id}: {exc}") from exc
            self._mounted.pop(volume_id, None)
        with contextlib.suppress(FileNotFoundError):
            point.rmdir()

    def _image(self, volume_id: str) -> Path:
        if not _ID.fullmatch(volume_id):
            raise ValueError(f"not a volume id: {volume_id!r}")
        return self._images / f"{volume_id}.img"


def _run(argv: list[str], doing: str) -> str:
    """Run a host tool (root, an empty environment); its output, or ``SandboxError``."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_SECONDS, env={"PATH": _SYSTEM_PATH},
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{doing}: {exc}") from exc
    if done.returncode != 0:
        raise SandboxError(f"{doing}: {(done.stderr or done.stdout).strip()}")
    return done.stdout
