"""Extracting an archive that came from a sandbox, treating it as hostile.

A sandbox's archive is the sandbox's word: root inside a sandbox can make its daemon send
any bytes at all (design 12.4). So nothing here relies on ``tarfile``'s extraction filters
(the ``data`` filter of CPython before 3.11.13 / 3.12.11 / 3.13.4 can be led outside the
target past PATH_MAX, CVE-2025-4517); ``tarfile`` only parses the headers, and every write
is made by this module, relative to file descriptors:

- only regular files, directories and symbolic links are accepted; a hard link, a device,
  a fifo, or any other kind refuses the whole archive (Ringfence's writers never make them);
- a name that is absolute, holds ``..`` or a NUL, is too long, or comes twice (``d`` and
  ``d/`` are one name), refuses the archive, and so does an entry under a symbolic link's
  name (a link is never written through);
- every parent directory is opened from the target's descriptor one component at a time
  with ``O_NOFOLLOW | O_DIRECTORY`` (never a path string through links), and files are
  created ``O_EXCL | O_NOFOLLOW``: nothing that exists is ever replaced;
- symbolic links are created last, after every file, and only when their target, resolved
  component by component through the archive's own directories and links (bounded hops,
  no PATH_MAX to give up at), stays inside the target; one that points outside (absolute,
  or up past the target) is left out, and counted;
- modes are masked: no setuid, setgid or sticky bit, nothing writable by group or others
  (``& 0o755``), and the owner can always read and write what was made; owners are not kept;
- the total size of the files, the number of entries, and the lengths of names are bounded,
  and going past a bound refuses the archive with a message that says which.

A refused archive raises ``SandboxError`` naming the entry; what was extracted before it
stays (the target was empty, so the caller can remove it whole).
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ringfence.errors import SandboxError

__all__ = ["MAX_ARCHIVE_BYTES", "MAX_ARCHIVE_ENTRIES", "Extracted", "extract_archive"]

MAX_ARCHIVE_BYTES = 64 << 30  # the files' contents together
MAX_ARCHIVE_ENTRIES = 1_000_000
_MAX_NAME = 4096  # bytes of a whole name, and of a link's target (Linux's PATH_MAX)
_MAX_COMPONENT = 255
_MAX_DEPTH = 256
_MAX_LINK_HOPS = 40
_MAX_EXTENDED_HEADER = 1 << 20
_EXTENDED = (
    tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)  # fmt: skip
_COPY_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)

Name = tuple[str, ...]


@dataclass
class Extracted:
    """What ``extract_archive`` made and left out."""

    files: int = 0
    directories: int = 0
    links: int = 0
    links_left_out: int = 0  # symbolic links that point outside the target
    bytes: int = 0


@dataclass
class _Model:
    """The archive's tree as extracted so far: every name, and what it is."""

    dirs: dict[Name, int] = field(default_factory=lambda: {(): 0o755})  # name -> mode
    files: set[Name] = field(default_factory=set)
    links: dict[Name, str] = field(default_factory=dict)  # name -> target


def extract_archive(
    archive: Path,
    target: Path,
    *,
    max_bytes: int = MAX_ARCHIVE_BYTES,
    max_entries: int = MAX_ARCHIVE_ENTRIES,
) -> Extracted:
    """Extract the tar at ``archive`` into the directory ``target`` (which should be empty;
    it must exist and not be a symbolic link), as the module says.

    Raises:
        SandboxError: the archive is refused (the message names the entry and why), or it
            is not a sound tar (cut short, malformed).
        OSError: the local side failed (disk full, permissions).
    """
    root = os.open(target, _DIR_FLAGS)
    try:
        with tarfile.open(archive, "r:", tarinfo=_BoundedTarInfo) as tar:
            done = _extract(tar, root, max_bytes, max_entries)
            _check_end_marker(tar)
            return done
    except tarfile.TarError as exc:
        raise SandboxError(f"not a sound tar: {exc}") from exc
    finally:
        os.close(root)


class _BoundedTarInfo(tarfile.TarInfo):
    """A header whose extended headers (pax, GNU long names) are refused past
    ``_MAX_EXTENDED_HEADER`` bytes before ``tarfile`` reads one whole into memory."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > _MAX_EXTENDED_HEADER:
            raise tarfile.ReadError(
                f"an extended header of {self.size} bytes (more than {_MAX_EXTENDED_HEADER})"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc, no-any-return]


def _extract(tar: tarfile.TarFile, root: int, max_bytes: int, max_entries: int) -> Extracted:
    model = _Model()
    done = Extracted()
    seen: set[Name] = set()
    for count, member in enumerate(_members(tar), start=1):
        if count > max_entries:
            raise SandboxError(f"the archive has more than {max_entries} entries")
        name = _name_of(member)
        if name in seen:
            raise SandboxError(f"the archive names {_shown(member.name)} twice")
        seen.add(name)
        _refuse_under_link(model, name, member)
        if member.type == tarfile.DIRTYPE:
            if name in model.files:
                raise SandboxError(f"{_shown(member.name)} is both a file and a directory")
            os.close(_directory(root, model, name))
            model.dirs[name] = _masked(member.mode) | 0o700
            done.directories += 1
        elif member.type in _REGULAR:
            if member.size < 0:
                raise SandboxError(f"the archive's file {_shown(member.name)} has a negative size")
            done.bytes += member.size
            if done.bytes > max_bytes:
                raise SandboxError(
                    f"the archive's files hold more than {max_bytes} bytes "
                    f"(at {_shown(member.name)})"
                )
            _file(tar, member, root, model, name)
            done.files += 1
        elif member.type == tarfile.SYMTYPE:
            _check_link_target(member)
            if name in model.dirs or name in model.files:
                raise SandboxError(f"{_shown(member.name)} is both a link and something else")
            model.links[name] = member.linkname
        else:
            kind = "a hard link" if member.type == tarfile.LNKTYPE else "a special file"
            raise SandboxError(f"the archive holds {kind}: {_shown(member.name)} (refused)")
    for name, link_target in model.links.items():
        if _resolves_inside(model, name, link_target):
            parent = _directory(root, model, name[:-1])
            try:
                os.symlink(link_target, name[-1], dir_fd=parent)
            finally:
                os.close(parent)
            done.links += 1
        else:
            done.links_left_out += 1
    for name in sorted(model.dirs, key=len, reverse=True):  # last: modes may forbid writes
        directory = _directory(root, model, name)
        try:
            os.fchmod(directory, model.dirs[name])
        finally:
            os.close(directory)
    return done


def _check_end_marker(tar: tarfile.TarFile) -> None:
    """``tarfile`` takes an archive cut at an entry's boundary for a whole one; a sandbox's
    stream cut short (it ended, or the server cut it at its size bound) ends that way too,
    so the end marker (a zero block) is required."""
    assert tar.fileobj is not None
    tar.fileobj.seek(tar.offset)
    block = tar.fileobj.read(tarfile.BLOCKSIZE)
    if len(block) < tarfile.BLOCKSIZE or block.count(0) != tarfile.BLOCKSIZE:
        raise SandboxError(
            "the archive was cut short (no tar end marker): the sandbox ended, or the "
            "archive was larger than the server streams (RINGFENCE_ARCHIVE_MAX_BYTES)"
        )


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members one at a time (``getmembers`` would hold them all before any check)."""
    while (member := tar.next()) is not None:
        yield member


def _name_of(member: tarfile.TarInfo) -> Name:
    raw = member.name
    if "\0" in raw:
        raise SandboxError(f"the archive has a name with a NUL byte: {_shown(raw)}")
    if len(os.fsencode(raw)) > _MAX_NAME:
        raise SandboxError(f"the archive has a name longer than {_MAX_NAME} bytes")
    if raw.startswith("/"):
        raise SandboxError(f"the archive has an absolute name: {_shown(raw)}")
    parts = tuple(part for part in raw.split("/") if part not in ("", "."))
    if ".." in parts:
        raise SandboxError(f"the archive has a name that climbs with '..': {_shown(raw)}")
    if not parts:
        raise SandboxError(f"the archive has an entry for the directory itself: {_shown(raw)}")
    if len(parts) > _MAX_DEPTH:
        raise SandboxError(f"the archive goes deeper than {_MAX_DEPTH} levels: {_shown(raw)}")
    if any(len(os.fsencode(part)) > _MAX_COMPONENT for part in parts):
        raise SandboxError(f"the archive has a name component longer than {_MAX_COMPONENT}")
    return parts


def _shown(name: str) -> str:
    """A name for a message: quoted, and clipped (a crafted one may be kilobytes long)."""
    return repr(name) if len(name) <= 120 else f"{name[:117]!r}..."


def _refuse_under_link(model: _Model, name: Name, member: tarfile.TarInfo) -> None:
    for depth in range(1, len(name)):
        if name[:depth] in model.links:
            raise SandboxError(
                f"the archive puts {_shown(member.name)} under the symbolic link "
                f"{_shown('/'.join(name[:depth]))} (refused: nothing is written through a link)"
            )
        if name[:depth] in model.files:
            raise SandboxError(f"the archive puts {_shown(member.name)} under a file")


def _check_link_target(member: tarfile.TarInfo) -> None:
    if "\0" in member.linkname or not member.linkname:
        raise SandboxError(f"the symbolic link {_shown(member.name)} has an empty or NUL target")
    if len(os.fsencode(member.linkname)) > _MAX_NAME:
        raise SandboxError(f"the symbolic link {_shown(member.name)} has a target too long")


def _masked(mode: int) -> int:
    return mode & 0o755  # no setuid, setgid, sticky; nothing writable by group or others


def _directory(root: int, model: _Model, name: Name) -> int:
    """A descriptor of directory ``name`` (the caller closes it), made (0700, its mode comes
    at the end) with every missing parent, each opened ``O_NOFOLLOW`` from its parent's."""
    current = os.dup(root)
    try:
        for depth in range(1, len(name) + 1):
            part = name[depth - 1]
            if name[:depth] not in model.dirs:
                with contextlib.suppress(FileExistsError):  # an explicit entry came after
                    os.mkdir(part, 0o700, dir_fd=current)
                model.dirs.setdefault(name[:depth], 0o755)
            child = os.open(part, _DIR_FLAGS, dir_fd=current)
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current


def _file(
    tar: tarfile.TarFile, member: tarfile.TarInfo, root: int, model: _Model, name: Name
) -> None:
    if name in model.dirs:
        raise SandboxError(f"{_shown(member.name)} is both a directory and a file")
    source = tar.extractfile(member)
    if source is None:
        raise SandboxError(f"the archive's file {_shown(member.name)} has no content")
    parent = _directory(root, model, name[:-1])
    try:
        fd = os.open(name[-1], _FILE_FLAGS, 0o600, dir_fd=parent)
    finally:
        os.close(parent)
    model.files.add(name)
    with source, os.fdopen(fd, "wb") as sink:
        while chunk := source.read(_COPY_CHUNK):
            sink.write(chunk)
        os.fchmod(sink.fileno(), _masked(member.mode) | 0o600)
        with contextlib.suppress(OverflowError, ValueError, OSError):
            os.utime(sink.fileno(), (member.mtime, member.mtime))


def _resolves_inside(model: _Model, name: Name, link_target: str) -> bool:
    """Whether the link at ``name`` to ``link_target`` stays inside the target, resolved as
    the kernel would over what the archive made: through its directories and links, each
    ``..`` leaving the directory actually reached (not the one spelt). A name the archive
    did not make is taken as a directory, as a later ``..`` would then pop it."""
    if link_target.startswith("/"):
        return False
    pending = [part for part in link_target.split("/") if part not in ("", ".")]
    position: list[str] = list(name[:-1])
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not position:
                return False
            position.pop()
            continue
        here = (*position, part)
        if here in model.links:
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return False  # a loop, or too long a chain: left out
            further = model.links[here]
            if further.startswith("/"):
                return False
            pending = [p for p in further.split("/") if p not in ("", ".")] + pending
            continue
        if here in model.files and pending:
            return False  # through a file: the kernel stops (ENOTDIR); not kept either
        position.append(part)
    return True
