"""A directory as a tar stream (POSIX pax), produced as it is read: never held whole.

``tar_stream(directory_fd)`` walks the tree under an open directory relative to file
descriptors (``openat`` with ``O_NOFOLLOW``), so nothing outside it is ever reached,
whatever its entries are or become while it is read:

- a directory is entered only through a descriptor opened with ``O_DIRECTORY |
  O_NOFOLLOW`` from its parent's; one swapped for a symbolic link meanwhile is stored as
  that link (never followed);
- a symbolic link is stored as a link (its target as text, whatever it names);
- a regular file is opened with ``O_NOFOLLOW | O_NONBLOCK`` from its parent's descriptor
  and checked to still be a regular file; its size is taken at open, and exactly that many
  bytes are stored (a file that shrinks while read is padded with zero bytes, one that grows
  is cut at the size it had);
- hard links are stored as separate files; fifos, sockets and devices are skipped (their
  count is ``Walk.skipped``), and so is what cannot be read (``Walk.unreadable``);
- names are relative to the directory, never absolute and never with ``..``;
  ``skip_dirs`` (names relative to it) are not entered, as ``/proc`` and ``/sys`` when the
  directory is ``/``.

Owners are numeric ids only (no names: an archive says nothing of the host's users).
Standard library only, and imports nothing of the daemon's: the host imports it too (an
archive of a volume's directory).
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator

__all__ = ["CHUNK", "Walk", "tar_stream"]

CHUNK = 256 * 1024  # the largest piece yielded (and read from a file at once)
_BLOCK = tarfile.BLOCKSIZE
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Walk:
    """What a ``tar_stream`` stored and left out (read once it is exhausted)."""

    def __init__(self) -> None:
        self.entries = 0
        self.skipped = 0  # fifos, sockets, devices
        self.unreadable = 0  # entries that could not be opened or read


def tar_stream(
    directory_fd: int, walk: Walk | None = None, skip_dirs: frozenset[str] = frozenset()
) -> Iterator[bytes]:
    """The tar of everything under ``directory_fd`` (which stays open: the caller's), in
    pieces of at most ``CHUNK`` bytes, ending with the archive's end marker. ``walk``
    collects what was stored and skipped.

    Raises:
        OSError: ``directory_fd`` itself cannot be listed (nothing was yielded then).
    """
    walk = walk or Walk()
    pending = bytearray()
    names = sorted(os.listdir(directory_fd), reverse=True)  # the top: errors are the caller's
    # (its descriptor, its name with a slash, the names in it still to store: last first)
    stack: list[tuple[int, str, list[str]]] = [(os.dup(directory_fd), "", names)]
    try:
        while stack:
            fd, prefix, left = stack[-1]
            if not left:
                stack.pop()
                os.close(fd)
                continue
            name = left.pop()
            for piece in _entry(fd, prefix, name, walk, stack, skip_dirs):
                pending += piece
                if len(pending) >= CHUNK:
                    yield bytes(pending)
                    pending.clear()
        pending += b"\0" * (2 * _BLOCK)
        yield bytes(pending)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _entry(
    parent: int,
    prefix: str,
    name: str,
    walk: Walk,
    stack: list[tuple[int, str, list[str]]],
    skip_dirs: frozenset[str],
) -> Iterator[bytes]:
    """The pieces of one entry; a directory is pushed on ``stack`` to be walked next."""
    path = prefix + name
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:  # gone meanwhile
        walk.unreadable += 1
        return
    if stat.S_ISLNK(info.st_mode):
        yield from _link(parent, name, path, info, walk)
    elif stat.S_ISDIR(info.st_mode):
        if path in skip_dirs:
            return
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError:  # unreadable, or swapped for a link or a file meanwhile
            walk.unreadable += 1
            return
        try:
            children = sorted(os.listdir(child), reverse=True)
            opened = os.fstat(child)
        except OSError:
            os.close(child)
            walk.unreadable += 1
            return
        walk.entries += 1
        yield _header(path + "/", tarfile.DIRTYPE, opened)
        stack.append((child, path + "/", children))
    elif stat.S_ISREG(info.st_mode):
        yield from _file(parent, name, path, walk)
    else:
        walk.skipped += 1


def _link(parent: int, name: str, path: str, info: os.stat_result, walk: Walk) -> Iterator[bytes]:
    try:
        target = os.readlink(name, dir_fd=parent)
    except OSError:
        walk.unreadable += 1
        return
    walk.entries += 1
    yield _header(path, tarfile.SYMTYPE, info, linkname=target)


def _file(parent: int, name: str, path: str, walk: Walk) -> Iterator[bytes]:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
    except OSError:  # unreadable, or swapped for a link or a fifo meanwhile
        walk.unreadable += 1
        return
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            walk.skipped += 1
            return
        walk.entries += 1
        yield _header(path, tarfile.REGTYPE, info, size=info.st_size)
        left = info.st_size
        while left > 0:
            try:
                data = os.read(fd, min(CHUNK, left))
            except OSError:
                data = b""
            if not data:  # shrank (or failed) while read: the size was promised
                yield from _zeros(left)
                break
            left -= len(data)
            yield data
        if info.st_size % _BLOCK:
            yield b"\0" * (_BLOCK - info.st_size % _BLOCK)
    finally:
        os.close(fd)


def _zeros(count: int) -> Iterator[bytes]:
    """``count`` zero bytes in pieces of at most ``CHUNK`` (a file that shrank from a huge
    apparent size must not cost its size in memory)."""
    piece = bytes(min(CHUNK, count))
    while count > 0:
        yield piece if count >= len(piece) else piece[:count]
        count -= len(piece)


def _header(
    path: str, kind: bytes, info: os.stat_result, *, size: int = 0, linkname: str = ""
) -> bytes:
    entry = tarfile.TarInfo(path)
    entry.type = kind
    entry.size = size
    entry.mode = stat.S_IMODE(info.st_mode)
    entry.mtime = int(info.st_mtime)
    entry.uid, entry.gid = info.st_uid, info.st_gid
    entry.uname = entry.gname = ""
    entry.linkname = linkname
    return entry.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
