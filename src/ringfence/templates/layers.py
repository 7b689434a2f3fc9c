"""Applying one image layer (a tar stream) to a root filesystem, treating it as hostile.

A layer may try to write outside the root: a name that is absolute or holds ``..`` makes the
whole import fail. Symlinks are created as they are (inside a sandbox they resolve within
the sandbox's own root), and when a later entry's path goes through one, it is resolved as if
the root filesystem were ``/``, the way Docker does: ``link -> /etc`` then ``link/passwd``
writes the template's ``etc/passwd``, never the host's. Nothing is ever opened through a
symlink on the host side (``O_NOFOLLOW`` on the last component, every parent resolved by
hand).

Nothing is taken on trust either: ownership is dropped (files belong to Ringfence's user),
setuid, setgid and sticky bits are dropped, modes become 0755 or 0644 (0755 for directories),
so the sandbox user can read everything and write nothing; device nodes, FIFOs and sockets
are skipped.

Whiteouts (the OCI image spec, "Representation of changes"): ``.wh.NAME`` deletes ``NAME``
from the layers below, ``.wh..wh..opq`` empties its directory of what the layers below put
in it. They are applied before the layer's own entries, so that they never touch those.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from collections import Counter

from ringfence.errors import InvalidRequest

__all__ = ["apply_layer", "entry_parts"]

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_MAX_LINK_HOPS = 40


def entry_parts(name: str) -> list[str]:
    """The components of a layer entry's path, relative to the root.

    Raises:
        InvalidRequest: the path is absolute or climbs with ``..``.
    """
    if name.startswith("/"):
        raise InvalidRequest(f"refusing an absolute path in the image: {name!r}")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise InvalidRequest(f"refusing a path that climbs out of the image: {name!r}")
    return parts


def apply_layer(layer: tarfile.TarFile, root: str, counts: Counter[str]) -> None:
    """Apply ``layer`` over what ``root`` holds. ``counts`` tallies what was skipped or
    changed (``devices``, ``setuid``...), for the template's metadata.

    Raises:
        InvalidRequest: an entry tries to leave the root, or the layer is malformed.
    """
    members = layer.getmembers()
    for member in members:  # first: the whiteouts, which apply to the layers below only
        parts = entry_parts(member.name)
        if parts and parts[-1].startswith(WHITEOUT):
            _whiteout(root, parts)
            counts["whiteouts"] += 1
    for member in members:
        parts = entry_parts(member.name)
        if parts and not parts[-1].startswith(WHITEOUT):
            _extract(layer, member, root, parts, counts)


def _whiteout(root: str, parts: list[str]) -> None:
    directory = _walk(root, parts[:-1], create=False)
    if directory is None:
        return
    name = parts[-1]
    if name == OPAQUE:
        for child in os.listdir(directory):
            _remove(os.path.join(directory, child))
    elif not name.startswith(
        WHITEOUT + WHITEOUT
    ):  # other .wh..wh. markers (aufs) mean nothing here
        victim = name.removeprefix(WHITEOUT)
        if victim in ("", ".", ".."):
            raise InvalidRequest(f"refusing a whiteout that names {victim!r}")
        _remove(os.path.join(directory, victim))


def _extract(
    layer: tarfile.TarFile,
    member: tarfile.TarInfo,
    root: str,
    parts: list[str],
    counts: Counter[str],
) -> None:
    if member.isdev():
        counts["devices"] += 1  # character and block devices, FIFOs: never in a template
        return
    if member.mode & (stat.S_ISUID | stat.S_ISGID):
        counts["setuid"] += 1
    parent = _walk(root, parts[:-1], create=True)
    assert parent is not None
    path = os.path.join(parent, parts[-1])
    if member.isdir():
        if os.path.lexists(path) and not _is_dir(path):
            os.unlink(path)
        if not os.path.lexists(path):
            os.mkdir(path)
        os.chmod(path, 0o755)
        return
    if not (member.isreg() or member.issym() or member.islnk()):
        counts["skipped"] += 1
        return
    if os.path.lexists(path):
        _remove(path)
    if member.issym():
        os.symlink(member.linkname, path)
    elif member.islnk():
        source = _link_source(root, member)
        os.link(source, path, follow_symlinks=False)
    else:
        _write_file(layer, member, path)
    os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)


def _write_file(layer: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> None:
    source = layer.extractfile(member)
    if source is None:
        raise InvalidRequest(f"the image's file {member.name!r} has no content")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    with source, os.fdopen(fd, "wb") as target:
        shutil.copyfileobj(source, target, 1 << 20)
        os.fchmod(target.fileno(), 0o755 if member.mode & 0o111 else 0o644)


def _link_source(root: str, member: tarfile.TarInfo) -> str:
    parts = entry_parts(member.linkname)
    if not parts:
        raise InvalidRequest(f"hard link {member.name!r} to the root")
    directory = _walk(root, parts[:-1], create=False)
    source = os.path.join(directory, parts[-1]) if directory else ""
    if not source or not os.path.lexists(source) or _is_dir(source):
        raise InvalidRequest(
            f"hard link {member.name!r} to {member.linkname!r}, which is not a file before it"
        )
    return source


def _walk(root: str, parts: list[str], *, create: bool) -> str | None:
    """The host path of directory ``parts`` inside ``root``, following symlinks as if
    ``root`` were ``/`` (``..`` stops at it, absolute targets start from it). Missing
    directories are made when ``create``; otherwise None is returned for them.

    Raises:
        InvalidRequest: a component is a file, or symlinks loop.
    """
    current: list[str] = []
    todo = list(parts)
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if current:
                current.pop()
            continue
        candidate = os.path.join(root, *current, part)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            if not create:
                return None
            os.mkdir(candidate)
            os.chmod(candidate, 0o755)
            current.append(part)
            continue
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise InvalidRequest(f"too many symlinks in {'/'.join(parts)!r}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = []
            todo = target.split("/") + todo
            continue
        if not stat.S_ISDIR(st.st_mode):
            if not create:
                return None
            raise InvalidRequest(f"{'/'.join(parts)!r} goes through a file, not a directory")
        current.append(part)
    return os.path.join(root, *current) if current else root


def _is_dir(path: str) -> bool:
    return stat.S_ISDIR(os.lstat(path).st_mode)


def _remove(path: str) -> None:
    if not os.path.lexists(path):
        return
    if _is_dir(path):
        shutil.rmtree(path)  # never follows symlinks: they are unlinked, not descended
    else:
        os.unlink(path)
