"""File calls on a volume without a sandbox: the server (root) acts on the volume's host
mount, so every path is walked as hostile.

A path is taken from the volume's root one name at a time, each opened relative to its
parent's descriptor with ``O_NOFOLLOW``: a symlink anywhere in it (one a sandbox planted, or
swapped in while the call runs) fails the call instead of being followed, ``..`` is refused
before anything is opened, and nothing is ever resolved against the host's root. Only
regular files are read or written (a FIFO would block the server; device nodes are inert on
the ``nodev`` mount and refused anyway); modes never carry setuid or setgid bits. What the
server writes belongs to the sandbox user (1000) unless the caller names other ids: the
ids on disk are the ones sandboxes see (``disks``).

Every function is blocking: the service runs them in worker threads.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from ringfence.backends.local.disks import NEUTRAL_USER
from ringfence.errors import Conflict, InvalidRequest, NotFound, VolumeFull
from ringfence.models import VolumeEntry
from ringfence.sandboxd.archive import tar_stream

__all__ = [
    "MAX_DEPTH",
    "Upload",
    "archive",
    "begin_write",
    "entries",
    "entry",
    "make_dir",
    "normalized",
    "open_for_reading",
    "read_chunks",
    "remove",
    "update",
    "write",
]

MAX_DEPTH = 16  # a listing's depth
_MAX_ENTRIES = 10_000  # entries one listing returns at most
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MODE_BITS = 0o1777  # what a caller may set: never setuid or setgid
_CHUNK = 1 << 20


def normalized(path: str) -> tuple[str, ...]:
    """The names of ``path`` from the volume's root ('' and '/' are the root).

    Raises:
        InvalidRequest: it has ``..``, a NUL, or is too long.
    """
    if "\0" in path or len(path) > 4096:
        raise InvalidRequest(f"path: not a usable path: {path[:100]!r}")
    names = tuple(name for name in path.split("/") if name not in ("", "."))
    if ".." in names:
        raise InvalidRequest(f"path: must not contain '..': {path!r}")
    return names


def entry(root: Path, path: str) -> VolumeEntry:
    """The file or directory at ``path``. Raises ``NotFound``, ``InvalidRequest``."""
    names = normalized(path)
    with _parent(root, names) as parent:
        if not names:
            return _entry("/", "", os.fstat(parent), None)
        found = _lstat(parent, names[-1], path)
        return _entry(_shown(names), names[-1], found, _target(parent, names[-1], found))


def entries(root: Path, path: str, depth: int = 1) -> list[VolumeEntry]:
    """What the directory at ``path`` holds, ``depth`` levels down (1: its own entries),
    sorted by path; symlinks are listed, never followed. Raises ``NotFound``,
    ``InvalidRequest`` (not a directory, or a depth out of 1..16)."""
    if not 1 <= depth <= MAX_DEPTH:
        raise InvalidRequest(f"depth: must be 1 to {MAX_DEPTH}")
    names = normalized(path)
    found: list[VolumeEntry] = []
    with _directory(root, names, path) as directory:
        _list(directory, names, depth, found)
    return sorted(found, key=lambda e: e.path)


def _list(directory: int, names: tuple[str, ...], depth: int, found: list[VolumeEntry]) -> None:
    """Add what ``directory`` holds to ``found``, read in the directory's own order a few
    names at a time (``scandir``): a directory of a million names costs no more than the
    listing's bound before it is refused."""
    with os.scandir(directory) as listed:
        for dir_entry in listed:
            if len(found) >= _MAX_ENTRIES:
                raise InvalidRequest(
                    f"the listing has more than {_MAX_ENTRIES} entries: go less deep"
                )
            _listed(directory, names, dir_entry.name, depth, found)


def _listed(
    directory: int, names: tuple[str, ...], name: str, depth: int, found: list[VolumeEntry]
) -> None:
    with contextlib.suppress(FileNotFoundError):  # removed while listed
        info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        child = (*names, name)
        found.append(_entry(_shown(child), name, info, _target(directory, name, info)))
        if depth > 1 and stat.S_ISDIR(info.st_mode):
            with _opened(directory, name, _DIR, _shown(child)) as below:
                _list(below, child, depth - 1, found)


def open_for_reading(root: Path, path: str) -> int:
    """A descriptor of the regular file at ``path`` (the caller closes it). Raises
    ``NotFound``, ``InvalidRequest`` (a directory or a special file)."""
    names = normalized(path)
    if not names:
        raise InvalidRequest("path: the volume's root is a directory")
    with _parent(root, names) as parent:
        fd = _open(parent, names[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, path)
    try:
        _regular(fd, path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write(
    root: Path,
    path: str,
    chunks: Iterable[bytes],
    *,
    uid: int | None = None,
    gid: int | None = None,
    mode: int | None = None,
    parents: bool = True,
) -> VolumeEntry:
    """Write the file at ``path`` whole from ``chunks`` (``begin_write``, then each chunk,
    then ``Upload.commit``; aborted on any error, so the old file stays as it was).

    Raises: as ``begin_write`` and ``Upload.write``.
    """
    upload = begin_write(root, path, uid=uid, gid=gid, mode=mode, parents=parents)
    try:
        for chunk in chunks:
            upload.write(chunk)
        return upload.commit()
    except BaseException:
        upload.abort()
        raise


class Upload:
    """A file being written: its bytes go to a new file beside the target (a hidden name in
    the same directory), which replaces the target only by ``commit`` (one ``rename``). An
    upload that fails, is cut off or is abandoned (``abort``) leaves the old file as it was
    and nothing of its own. Each method is blocking and short (one chunk): the service runs
    them in worker threads and reads the request body itself, so no thread ever waits on a
    client."""

    def __init__(
        self, parent: int, name: str, temporary: str, fd: int, path: str, owner: tuple[int, int],
        mode: int,
    ) -> None:  # fmt: skip
        self._parent = parent
        self._name = name
        self._temporary = temporary
        self._fd = fd
        self._path = path
        self._owner = owner
        self._mode = mode
        self._open = True

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``. Raises ``VolumeFull`` (no room), ``InvalidRequest``."""
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            raise _refused(exc, self._path) from exc

    def commit(self) -> VolumeEntry:
        """Put the file in place of the old one (with the old one's owner and mode unless
        the call named others) and say what it is now. Raises ``VolumeFull``,
        ``InvalidRequest`` (the target became a directory meanwhile)."""
        try:
            os.fchown(self._fd, *self._owner)
            os.fchmod(self._fd, self._mode)
            found = os.fstat(self._fd)
            os.rename(self._temporary, self._name, src_dir_fd=self._parent,
                      dst_dir_fd=self._parent)  # fmt: skip
        except OSError as exc:
            self.abort()
            raise _refused(exc, self._path) from exc
        self._close()
        names = normalized(self._path)
        return _entry(_shown(names), self._name, found, None)

    def abort(self) -> None:
        """Forget the upload: its new file is removed, the old one is untouched. Idempotent."""
        if self._open:
            with contextlib.suppress(OSError):
                os.unlink(self._temporary, dir_fd=self._parent)
            self._close()

    def _close(self) -> None:
        if self._open:
            self._open = False
            os.close(self._fd)
            os.close(self._parent)


def begin_write(
    root: Path,
    path: str,
    *,
    uid: int | None = None,
    gid: int | None = None,
    mode: int | None = None,
    parents: bool = True,
) -> Upload:
    """Start writing the file at ``path`` whole (a new file, or one replacing it), its
    parents made when ``parents``; owned by ``uid``:``gid`` (default: the old file's owner,
    or the sandbox user for a new file) with ``mode`` (default: the old file's, or 0o644).

    Raises:
        VolumeFull: the volume has no room for even an empty file.
        NotFound: a parent is missing and ``parents`` is false.
        InvalidRequest: the path goes through or names a symlink, a directory or a special
            file, or an id or mode is out of range.
    """
    names = normalized(path)
    if not names:
        raise InvalidRequest("path: the volume's root is a directory")
    _checked_ids(uid, gid, mode)
    name = names[-1]
    with _parent(root, names, make=parents) as found_parent:
        parent = os.dup(found_parent)
    try:
        try:
            old: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        except OSError as exc:
            raise _refused(exc, path) from exc
        if old is not None and stat.S_ISLNK(old.st_mode):
            raise InvalidRequest(
                f"path: {path} is or goes through a symlink, which is not followed"
            )
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise InvalidRequest(f"path: {path} is a directory")
        if old is not None and not stat.S_ISREG(old.st_mode):
            raise InvalidRequest(f"path: {path} is not a regular file")
        owner = (
            (NEUTRAL_USER if uid is None else uid, NEUTRAL_USER if gid is None else gid)
            if old is None
            else (old.st_uid if uid is None else uid, old.st_gid if gid is None else gid)
        )
        bits = (0o644 if old is None else stat.S_IMODE(old.st_mode)) if mode is None else mode
        temporary = f".{name[:200]}.rf-upload-{secrets.token_hex(6)}"
        fd = _open(parent, temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                   path, 0o600)  # fmt: skip
    except BaseException:
        os.close(parent)
        raise
    return Upload(parent, name, temporary, fd, path, owner, bits & _MODE_BITS)


def make_dir(
    root: Path,
    path: str,
    *,
    uid: int | None = None,
    gid: int | None = None,
    mode: int | None = None,
    parents: bool = False,
) -> VolumeEntry:
    """Make the directory at ``path`` (its parents too when ``parents``).

    Raises:
        Conflict: something exists there already.
        NotFound: a parent is missing and ``parents`` is false. ``VolumeFull``.
    """
    names = normalized(path)
    if not names:
        raise InvalidRequest("path: the volume's root exists already")
    with _parent(root, names, make=parents) as parent:
        try:
            os.mkdir(names[-1], 0o755, dir_fd=parent)
        except FileExistsError as exc:
            raise Conflict(f"path: {path} exists already") from exc
        except OSError as exc:
            raise _refused(exc, path) from exc
        with _opened(parent, names[-1], _DIR, path) as made:
            _own(made, uid, gid, mode, made=True)
            return _entry(_shown(names), names[-1], os.fstat(made), None)


def update(
    root: Path, path: str, *, uid: int | None = None, gid: int | None = None,
    mode: int | None = None,
) -> VolumeEntry:  # fmt: skip
    """Change the owner or mode of the file or directory at ``path`` (never a symlink's
    target). Raises ``NotFound``, ``InvalidRequest``."""
    names = normalized(path)
    with _parent(root, names) as parent:
        if not names:
            _own(parent, uid, gid, mode)
            return _entry("/", "", os.fstat(parent), None)
        with _opened(parent, names[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, path) as fd:  # fmt: skip
            _own(fd, uid, gid, mode)
            return _entry(_shown(names), names[-1], os.fstat(fd), None)


def remove(root: Path, path: str) -> None:
    """Remove the file, symlink or whole directory at ``path`` (a symlink itself, never
    what it points to). Raises ``NotFound``, ``InvalidRequest`` (the root)."""
    names = normalized(path)
    if not names:
        raise InvalidRequest("path: the volume's root cannot be removed")
    with _parent(root, names) as parent:
        info = _lstat(parent, names[-1], path)
        try:
            if stat.S_ISDIR(info.st_mode):  # fd-relative, never follows a symlink
                shutil.rmtree(names[-1], dir_fd=parent)
            else:
                os.unlink(names[-1], dir_fd=parent)
        except OSError as exc:  # swapped for a link meanwhile: rmtree refuses it
            if exc.errno is None:
                raise InvalidRequest(f"path: {path} changed while it was removed") from exc
            raise _refused(exc, path) from exc


def read_chunks(fd: int) -> Iterator[bytes]:
    """The bytes of ``fd`` in chunks (closing it at the end)."""
    try:
        while chunk := os.read(fd, _CHUNK):
            yield chunk
    finally:
        os.close(fd)


def archive(root: Path, path: str) -> Iterator[bytes]:
    """The directory at ``path`` as a tar stream (``sandboxd.archive.tar_stream``, the
    daemon's own walk: fd-relative and ``O_NOFOLLOW`` throughout, entries named relative to
    the directory, symlinks stored as links, FIFOs, sockets and devices left out, a file
    changing while read cut or padded to its size at open), a chunk at a time.

    Raises (on the first ``next``):
        NotFound, InvalidRequest: as ``entries`` (not a directory, a symlink in the path).
    """
    names = normalized(path)
    with _directory(root, names, path) as directory:
        yield from tar_stream(directory)


@contextlib.contextmanager
def _parent(root: Path, names: tuple[str, ...], make: bool = False) -> Iterator[int]:
    """A descriptor of the directory holding the last of ``names`` (the root itself when
    there are none), each name opened below its parent without following a symlink; made
    (owned by the sandbox user) when missing and ``make``."""
    fd = os.open(root, _DIR)
    try:
        for depth, name in enumerate(names[:-1]):
            shown = _shown(names[: depth + 1])
            if make:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise _refused(exc, shown) from exc
                else:  # never follows: a swap for a symlink changes only the link's owner
                    os.chown(name, NEUTRAL_USER, NEUTRAL_USER, dir_fd=fd, follow_symlinks=False)
            below = _open(fd, name, _DIR, shown)
            os.close(fd)
            fd = below
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _directory(root: Path, names: tuple[str, ...], path: str) -> Iterator[int]:
    with _parent(root, names) as parent:
        if not names:
            yield os.dup(parent)
            return
        with _opened(parent, names[-1], _DIR, path) as directory:
            yield directory


@contextlib.contextmanager
def _opened(parent: int, name: str, flags: int, path: str) -> Iterator[int]:
    fd = _open(parent, name, flags, path)
    try:
        yield fd
    finally:
        os.close(fd)


def _open(parent: int, name: str, flags: int, path: str, mode: int = 0o600) -> int:
    try:
        return os.open(name, flags | os.O_CLOEXEC, mode, dir_fd=parent)
    except OSError as exc:
        raise _refused(exc, path) from exc


def _lstat(parent: int, name: str, path: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError as exc:
        raise _refused(exc, path) from exc


def _refused(exc: OSError, path: str) -> Exception:
    """The API's error for a failed call on ``path``."""
    if exc.errno == errno.ENOENT:
        return NotFound(f"no {path} in the volume")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return VolumeFull(f"the volume is full: {path} could not be written whole")
    if exc.errno == errno.ELOOP:
        return InvalidRequest(f"path: {path} is or goes through a symlink, which is not followed")
    if exc.errno == errno.ENOTDIR:
        return InvalidRequest(f"path: a part of {path} is not a directory")
    if exc.errno == errno.EISDIR:
        return InvalidRequest(f"path: {path} is a directory")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.ENXIO, errno.EROFS):
        return InvalidRequest(f"path: {path} cannot be used ({exc.strerror})")
    return InvalidRequest(f"path: {path}: {exc.strerror}")


def _regular(fd: int, path: str) -> None:
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        raise InvalidRequest(f"path: {path} is a directory")
    if not stat.S_ISREG(mode):
        raise InvalidRequest(f"path: {path} is not a regular file")


def _own(fd: int, uid: int | None, gid: int | None, mode: int | None, made: bool = False) -> None:
    """Set the owner and mode bits given; what this call ``made`` belongs to the sandbox
    user unless ids are given (the server made it as root)."""
    _checked_ids(uid, gid, mode)
    if made or uid is not None or gid is not None:
        default = NEUTRAL_USER if made else -1  # -1: fchown leaves it as it is
        os.fchown(fd, default if uid is None else uid, default if gid is None else gid)
    if mode is not None:
        os.fchmod(fd, mode & _MODE_BITS)


def _checked_ids(uid: int | None, gid: int | None, mode: int | None) -> None:
    for value, what in ((uid, "uid"), (gid, "gid")):
        if value is not None and not 0 <= value <= 65535:
            raise InvalidRequest(f"{what}: must be 0 to 65535")
    if mode is not None and not 0 <= mode <= 0o7777:
        raise InvalidRequest("mode: must be permission bits (0 to 0o7777)")


def _shown(names: tuple[str, ...]) -> str:
    return "/" + "/".join(names)


def _target(parent: int, name: str, info: os.stat_result) -> str | None:
    if not stat.S_ISLNK(info.st_mode):
        return None
    with contextlib.suppress(OSError):
        return os.readlink(name, dir_fd=parent)
    return None


def _kind(mode: int) -> Literal["file", "directory", "symlink", "unknown"]:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "unknown"  # a FIFO, a socket, a device node (inert: the mount is nodev)


def _entry(path: str, name: str, info: os.stat_result, target: str | None) -> VolumeEntry:
    def at(seconds: float) -> datetime:
        return datetime.fromtimestamp(seconds, UTC)

    return VolumeEntry(
        name=name, path=path, type=_kind(info.st_mode), size=info.st_size,
        mode=stat.S_IMODE(info.st_mode), uid=info.st_uid, gid=info.st_gid,
        mtime=at(info.st_mtime), atime=at(info.st_atime), ctime=at(info.st_ctime),
        target=target,
    )  # fmt: skip
