"""File primitives for the project engine: every name looked up with ``*at`` calls on a
directory descriptor and ``O_NOFOLLOW``, so a symlink is read as a link and never
traversed, and a directory is opened only with ``O_DIRECTORY | O_NOFOLLOW`` (a swap in
between fails instead of escaping). The same rules as the snapshot engine's
(``backends/local/snapshots/_fs.py``), kept apart: this package also writes to a host
directory, and must not depend on one backend's private modules."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterator, Sequence

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def open_dir_path(path: str) -> int:
    """A descriptor of the directory ``path`` (absolute), opened one component at a time
    from ``/`` without following any symlink: ``OSError`` (``ELOOP``, ``ENOTDIR``) when a
    component is a link or not a directory, whatever it points at."""
    if not path.startswith("/"):
        raise OSError(errno.EINVAL, "not an absolute path", path)
    fd = os.open("/", DIR_FLAGS)
    try:
        for part in (p for p in path.split("/") if p):
            if part == "..":
                raise OSError(errno.EINVAL, "'..' in a path", path)
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def opened_dir(dir_fd: int, name: str) -> Iterator[int]:
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_file(dir_fd: int, name: str, expect: os.stat_result) -> Iterator[int]:
    """Open a regular file for reading, checking it is the inode ``lstat`` saw
    (``OSError`` ``ESTALE`` when it was swapped)."""
    fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
            raise OSError(errno.ESTALE, "changed while it was read", name)
        yield fd
    finally:
        os.close(fd)


def read_head(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from offset 0."""
    chunks = []
    offset = 0
    while offset < limit and (chunk := os.pread(fd, min(_CHUNK, limit - offset), offset)):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def same_content(a: int, b: int, size: int) -> bool:
    """Whether two open files of ``size`` bytes hold the same bytes."""
    offset = 0
    while offset < size:
        left, right = os.pread(a, _CHUNK, offset), os.pread(b, _CHUNK, offset)
        if left != right:
            return False
        if not left:
            return True
        offset += len(left)
    return os.pread(a, 1, size) == os.pread(b, 1, size)


def copy_data(src: int, dst: int, size: int, limit: int) -> int:
    """Copy the first ``size`` bytes of ``src`` to the fresh file ``dst``, holes kept as
    holes (only the data extents ``SEEK_DATA``/``SEEK_HOLE`` find are written, then ``dst``
    is given the size); the data bytes written.

    Raises:
        TooLarge: more than ``limit`` data bytes would be written (some were).
    """
    written = 0
    offset = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                break
            raise
        end = min(os.lseek(src, start, os.SEEK_HOLE), size)
        while start < end:
            chunk = os.pread(src, min(_CHUNK, end - start), start)
            if not chunk:
                break
            written += len(chunk)
            if written > limit:
                raise TooLarge(written)
            os.pwrite(dst, chunk, start)
            start += len(chunk)
        offset = max(end, offset + 1)
    os.ftruncate(dst, size)
    return written


class TooLarge(Exception):
    """A copy passed its limit of data bytes."""


def proc_path(dir_fd: int, name: str) -> str:
    """A path naming ``name`` in ``dir_fd`` for calls with no ``dir_fd`` (xattrs)."""
    return f"/proc/self/fd/{dir_fd}/{name}"


def xattr(dir_fd: int, name: str, key: str) -> bytes | None:
    """Extended attribute ``key`` of ``name`` (not followed), None when it has none."""
    try:
        return os.getxattr(proc_path(dir_fd, name), key, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
            return None
        raise


def xattr_names(dir_fd: int, name: str) -> list[str]:
    try:
        return os.listxattr(proc_path(dir_fd, name), follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EPERM):
            return []
        raise


def remove_tree(dir_fd: int, name: str, mount: int) -> None:
    """Remove ``name`` from ``dir_fd`` whatever it is, never following a link and never
    entering or removing anything on another mount than ``mount`` (``OSError`` ``EXDEV``
    then, with what was removed before it gone). Iterative: one open directory per level."""
    st = lstat_at(dir_fd, name)
    if st is None:
        return
    check_mount(dir_fd, name, mount)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    first = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    stack: list[tuple[int, str, int, Iterator[str]]] = [
        (dir_fd, name, first, iter(os.listdir(first)))
    ]
    try:
        while stack:
            parent, here, fd, remaining = stack[-1]
            for child in remaining:
                child_st = lstat_at(fd, child)
                if child_st is None:
                    continue
                check_mount(fd, child, mount)
                if stat.S_ISDIR(child_st.st_mode):
                    child_fd = os.open(child, DIR_FLAGS, dir_fd=fd)
                    stack.append((fd, child, child_fd, iter(os.listdir(child_fd))))
                    break
                os.unlink(child, dir_fd=fd)
            else:
                stack.pop()
                os.close(fd)
                os.rmdir(here, dir_fd=parent)
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def check_names(parts: Sequence[str]) -> None:
    for name in parts:
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise OSError(errno.EINVAL, "not a file name", name)


# -- mounts -----------------------------------------------------------------------------------

_AT_SYMLINK_NOFOLLOW = 0x100
_AT_EMPTY_PATH = 0x1000
_STATX_MNT_ID = 0x1000
_STATX_ATTR_MOUNT_ROOT = 0x2000
_libc = ctypes.CDLL(None, use_errno=True)


def mount_of(dir_fd: int, name: str = "") -> int:
    """The id of the mount ``name`` in ``dir_fd`` is on (``dir_fd`` itself for ""), not
    following a link; -1 when ``name`` is a mount point."""
    buf = ctypes.create_string_buffer(256)  # struct statx
    flags = _AT_SYMLINK_NOFOLLOW | (_AT_EMPTY_PATH if not name else 0)
    if _libc.statx(dir_fd, name.encode(), flags, _STATX_MNT_ID, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), name)
    attributes = int.from_bytes(buf.raw[8:16], "little")
    if attributes & _STATX_ATTR_MOUNT_ROOT and name:
        return -1
    return int.from_bytes(buf.raw[144:152], "little")


def check_mount(dir_fd: int, name: str, mount: int) -> None:
    """``OSError`` ``EXDEV`` unless ``name`` in ``dir_fd`` (if it exists) is on ``mount``
    and is no mount point."""
    try:
        found = mount_of(dir_fd, name)
    except FileNotFoundError:
        return
    if found != mount:
        raise OSError(errno.EXDEV, "another file system is mounted there", name)


@contextlib.contextmanager
def opened_path(root_fd: int, parts: Sequence[str]) -> Iterator[int]:
    """The directory ``root_fd``/``parts...``, each component opened without following
    (``OSError`` when one is a link, not a directory, or gone)."""
    check_names(parts)
    fd = os.dup(root_fd)
    try:
        for part in parts:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


class DirChain:
    """Directories below ``root_fd``, each component opened without following, the chain
    of the last one opened kept open: opening a directory beside or below the last one
    opens only the components it does not share, so a walk in path order opens each
    directory once (linear), never a depth-long walk per entry. Close it when done."""

    def __init__(self, root_fd: int) -> None:
        self._root = root_fd
        self._names: list[str] = []
        self._fds: list[int] = []

    def __enter__(self) -> DirChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.pop())
            self._names.pop()

    def open(self, parts: Sequence[str]) -> int:
        """The directory ``parts`` (``OSError`` when a component is a link, not a
        directory, or gone); the descriptor stays this chain's, valid until its next
        ``open`` or ``close``."""
        check_names(parts)
        keep = 0
        for have, want in zip(self._names, parts, strict=False):
            if have != want:
                break
            keep += 1
        while len(self._fds) > keep:
            os.close(self._fds.pop())
            self._names.pop()
        for part in parts[keep:]:
            parent = self._fds[-1] if self._fds else self._root
            self._fds.append(os.open(part, DIR_FLAGS, dir_fd=parent))
            self._names.append(part)
        return self._fds[-1] if self._fds else self._root
