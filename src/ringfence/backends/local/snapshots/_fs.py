"""Safe file primitives for snapshots: everything relative to directory fds, nothing followed.

The trees read here are written by hostile code (frozen while we read, but planted before):
every name is looked up with ``*at`` calls on a directory fd and ``O_NOFOLLOW``, so a symlink
is read as a link and never traversed; a directory is opened only after ``lstat`` said it is
one, with ``O_DIRECTORY | O_NOFOLLOW`` (a swap in between fails instead of escaping).
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ringfence.errors import SandboxError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
KEPT_XATTRS = ("user.", "trusted.overlay.")  # security.* (file caps) and ACLs are not kept
_CHUNK = 1 << 20


class Kind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    WHITEOUT = "whiteout"  # overlayfs: a char device 0:0 in an upper layer hides a lower entry
    SKIPPED = "skipped"  # fifos and sockets: not captured, left alone by a rollback


def kind_of(st: os.stat_result, where: str) -> Kind:
    """The kind of an entry, or ``SandboxError`` for a device node (no sandbox can make one:
    finding one means the layer is not what it should be)."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return Kind.FILE
    if stat.S_ISDIR(mode):
        return Kind.DIR
    if stat.S_ISLNK(mode):
        return Kind.SYMLINK
    if stat.S_ISCHR(mode) and st.st_rdev == 0:
        return Kind.WHITEOUT
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return Kind.SKIPPED
    raise SandboxError(f"refusing to capture {where}: a device node")


@dataclass(frozen=True)
class Owners:
    """The host ids a sandbox's files may belong to, in order (index 0: its root). Files of
    any other id are refused; 0 (host root) is never one of them."""

    ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.ids or any(i <= 0 for i in self.ids) or len(set(self.ids)) != len(self.ids):
            raise ValueError(f"not a sandbox's host ids: {self.ids}")

    def check(self, st: os.stat_result, where: str) -> None:
        if st.st_uid not in self.ids or st.st_gid not in self.ids:
            raise SandboxError(
                f"refusing {where}: owned by {st.st_uid}:{st.st_gid}, not by the sandbox"
            )


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def names(dir_fd: int) -> list[str]:
    """The entries of an open directory (``os.listdir`` on an fd reads a dup of it)."""
    return os.listdir(dir_fd)


@contextlib.contextmanager
def opened_dir(dir_fd: int, name: str) -> Iterator[int]:
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_path(root_fd: int, parts: Sequence[str]) -> Iterator[int]:
    """The directory ``root_fd``/``parts...``, each component opened without following."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_file(dir_fd: int, name: str, expect: os.stat_result) -> Iterator[int]:
    """Open a regular file for reading, checking it is the inode ``lstat`` saw."""
    fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
            raise SandboxError(f"{name} changed while it was read")
        yield fd
    finally:
        os.close(fd)


def copy_data(src: int, dst: int) -> int:
    """Copy a whole file between fds from offset 0; the bytes copied."""
    total = 0
    while True:
        try:
            n = os.copy_file_range(src, dst, _CHUNK, total, total)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            return _copy_by_reading(src, dst, total)
        if n == 0:
            return total
        total += n


def _copy_by_reading(src: int, dst: int, offset: int) -> int:
    while chunk := os.pread(src, _CHUNK, offset):
        os.pwrite(dst, chunk, offset)
        offset += len(chunk)
    return offset


def proc_path(dir_fd: int, name: str) -> str:
    """A path naming ``name`` in ``dir_fd`` for calls with no ``dir_fd`` (xattrs): the
    ``/proc/self/fd`` link resolves to the directory itself; ``name`` is not followed."""
    return f"/proc/self/fd/{dir_fd}/{name}"


def read_xattrs(target: int | str) -> dict[str, bytes]:
    """The kept extended attributes of an fd or a ``proc_path`` (not followed)."""
    follow = not isinstance(target, str)
    try:
        keys = os.listxattr(target, follow_symlinks=follow)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EPERM):
            return {}
        raise
    kept = {}
    for key in keys:
        if key.startswith(KEPT_XATTRS):
            with contextlib.suppress(OSError):
                kept[key] = os.getxattr(target, key, follow_symlinks=follow)
    return kept


def write_xattrs(target: int | str, wanted: dict[str, bytes]) -> None:
    """Make the kept extended attributes of ``target`` exactly ``wanted``."""
    follow = not isinstance(target, str)
    for key in set(read_xattrs(target)) - set(wanted):
        os.removexattr(target, key, follow_symlinks=follow)
    for key, value in wanted.items():
        os.setxattr(target, key, value, follow_symlinks=follow)


def set_meta_fd(fd: int, st: os.stat_result, uid: int, gid: int) -> None:
    """Owner, then mode (chown clears setuid bits), then times of an open file or dir."""
    os.fchown(fd, uid, gid)
    os.fchmod(fd, stat.S_IMODE(st.st_mode))
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def set_meta_at(dir_fd: int, name: str, st: os.stat_result, uid: int, gid: int) -> None:
    """Owner and times of a symlink or whiteout (not followed); a whiteout's mode too."""
    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(name, stat.S_IMODE(st.st_mode), dir_fd=dir_fd, follow_symlinks=False)
    os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dir_fd, follow_symlinks=False)


def make_whiteout(dir_fd: int, name: str) -> None:
    os.mknod(name, stat.S_IFCHR | 0o600, os.makedev(0, 0), dir_fd=dir_fd)


def remove_tree(dir_fd: int, name: str, mount: int | None = None) -> None:
    """Remove ``name`` from ``dir_fd`` whatever it is, never following a link. Iterative
    (a sandbox may nest directories far deeper than Python's recursion limit): one open
    directory per level, each listed once. With ``mount``, every entry must be on that
    mount (``check_same_mount``): nothing mounted in it is entered or removed."""
    st = lstat_at(dir_fd, name)
    if st is None:
        return
    if mount is not None:
        check_same_mount(dir_fd, name, mount, name)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    first = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    stack: list[tuple[int, str, int, Iterator[str]]] = [(dir_fd, name, first, iter(names(first)))]
    try:
        while stack:
            parent, here, fd, remaining = stack[-1]
            for child in remaining:
                child_st = lstat_at(fd, child)
                if child_st is None:
                    continue
                if mount is not None:
                    check_same_mount(fd, child, mount, f"{here}/{child}")
                if stat.S_ISDIR(child_st.st_mode):
                    child_fd = os.open(child, DIR_FLAGS, dir_fd=fd)
                    stack.append((fd, child, child_fd, iter(names(child_fd))))
                    break
                os.unlink(child, dir_fd=fd)
            else:
                stack.pop()
                os.close(fd)
                os.rmdir(here, dir_fd=parent)
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def check_name(name: str, where: Sequence[str]) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise SandboxError(f"not a file name in {'/'.join(where) or '.'}: {name!r}")


# -- mounts -----------------------------------------------------------------------------------

_AT_SYMLINK_NOFOLLOW = 0x100
_AT_EMPTY_PATH = 0x1000
_STATX_MNT_ID = 0x1000
_STATX_ATTR_MOUNT_ROOT = 0x2000
_libc = ctypes.CDLL(None, use_errno=True)


def mount_of(dir_fd: int, name: str = "") -> int:
    """The id of the mount ``name`` in ``dir_fd`` is on (``dir_fd`` itself for ""), not
    following a link: a name something is mounted on gives that mount's id. -1 when the
    mount is the root of one (its root: only a mount point is)."""
    buf = ctypes.create_string_buffer(256)  # struct statx
    flags = _AT_SYMLINK_NOFOLLOW | (_AT_EMPTY_PATH if not name else 0)
    if _libc.statx(dir_fd, name.encode(), flags, _STATX_MNT_ID, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), name)
    attributes = int.from_bytes(buf.raw[8:16], "little")
    if attributes & _STATX_ATTR_MOUNT_ROOT and name:
        return -1
    return int.from_bytes(buf.raw[144:152], "little")


def check_same_mount(dir_fd: int, name: str, mount: int, where: str) -> None:
    """``SandboxError`` unless ``name`` in ``dir_fd`` (if it exists) is on ``mount`` and is
    no mount point: a walk through a sandbox's view never crosses into a mount."""
    try:
        found = mount_of(dir_fd, name)
    except FileNotFoundError:
        return
    if found != mount:
        raise SandboxError(f"refusing {where}: something is mounted there in the sandbox")
