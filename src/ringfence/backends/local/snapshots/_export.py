"""Exports: a snapshot persisted off the volume, sealed, and the populating of a fresh volume
from one.

An export directory holds ``manifest.json`` (every entry: layer, path, kind, mode, owner as
an index into the sandbox's ids, times, size, sha256, link target, xattrs), ``seal`` (the
HMAC-SHA256 of the manifest's bytes and the caller's ``context``, what the export belongs
to, under the server's key) and ``blobs/<sha256>``: each
distinct file content once, a plain file of root's, mode 0600. Nothing in it is a link,
a device or a setuid file; whiteouts and symlinks exist only in the manifest. ``populate``
checks the seal, then every blob (present, a regular file of its size, no extra one,
nothing else in the directory) before it writes a single file, and each blob's hash as it
copies it (read once); any failure empties the layers again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ringfence.backends.local.snapshots import _fs
from ringfence.backends.local.snapshots._fs import Kind, Owners
from ringfence.errors import SandboxError

MANIFEST = "manifest.json"
SEAL = "seal"
BLOBS = "blobs"
FORMAT = 1
_MAX_MANIFEST = 256 << 20
_SHA256 = re.compile("[0-9a-f]{64}")


def export_snapshot(
    snap_root: int,
    layers: Sequence[str],
    owners: Owners,
    key: bytes,
    target: Path,
    context: bytes = b"",
) -> None:
    """Write the snapshot open at ``snap_root`` to ``target`` (must not exist), sealed for
    ``context`` (see ``seal``). Raises ``SandboxError`` (``target`` is removed again then)."""
    try:
        os.mkdir(target, 0o700)
    except FileExistsError as exc:
        raise SandboxError(f"{target} exists: an export needs a new directory") from exc
    out = os.open(target, _fs.DIR_FLAGS)
    try:
        os.mkdir(BLOBS, 0o700, dir_fd=out)
        with _fs.opened_dir(out, BLOBS) as blobs:
            entries: list[dict[str, Any]] = []
            for layer in layers:
                with _fs.opened_dir(snap_root, layer) as fd:
                    entries.append(_entry(layer, "", os.fstat(fd), owners, None))
                    _walk(fd, layer, "", owners, blobs, entries, {})
        manifest = json.dumps(
            {"format": FORMAT, "layers": list(layers), "entries": entries},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        _write_new(out, MANIFEST, manifest)
        _write_new(out, SEAL, seal(key, manifest, context).encode())
    except BaseException:
        os.close(out)
        parent = os.open(target.parent, _fs.DIR_FLAGS)
        try:
            _fs.remove_tree(parent, target.name)
        finally:
            os.close(parent)
        raise
    os.close(out)


def seal(key: bytes, manifest: bytes, context: bytes = b"") -> str:
    """The HMAC of ``manifest`` bound to ``context``. A context is length-prefixed (a
    manifest, JSON, never starts with a zero byte, so no context/manifest split is
    ambiguous); no context seals the manifest alone."""
    bound = len(context).to_bytes(8, "big") + context if context else b""
    return hmac.new(key, bound + manifest, hashlib.sha256).hexdigest()


def _walk(
    dir_fd: int,
    layer: str,
    where: str,
    owners: Owners,
    blobs: int,
    entries: list[dict[str, Any]],
    groups: dict[int, tuple[str, str]],
) -> None:
    """Append the entries under ``dir_fd``; ``groups``: snapshot inode -> (the first path
    found with it, its sha256): in one snapshot only a hard-link group shares an inode."""
    for name in sorted(_fs.names(dir_fd)):
        path = f"{where}/{name}" if where else name
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        kind = _fs.kind_of(st, path)
        if kind is Kind.FILE and st.st_ino in groups:
            first, digest = groups[st.st_ino]
            entries.append(_entry(layer, path, st, owners, {"sha256": digest, "link": first}))
        elif kind is Kind.FILE:
            with _fs.opened_file(dir_fd, name, st) as fd:
                digest = _store_blob(fd, blobs)
            groups[st.st_ino] = (path, digest)
            entries.append(_entry(layer, path, st, owners, {"sha256": digest}))
            entries[-1]["xattrs"] = _encode(_xattrs_at(dir_fd, name))
        elif kind is Kind.DIR:
            with _fs.opened_dir(dir_fd, name) as child:
                entries.append(_entry(layer, path, st, owners, None))
                entries[-1]["xattrs"] = _encode(_fs.read_xattrs(child))
                _walk(child, layer, path, owners, blobs, entries, groups)
        else:
            extra = {"target": os.readlink(name, dir_fd=dir_fd)} if kind is Kind.SYMLINK else {}
            entries.append(_entry(layer, path, st, owners, extra))
            entries[-1]["xattrs"] = _encode(_xattrs_at(dir_fd, name))


def _xattrs_at(dir_fd: int, name: str) -> dict[str, bytes]:
    return _fs.read_xattrs(_fs.proc_path(dir_fd, name))


def _entry(
    layer: str,
    path: str,
    st: os.stat_result,
    owners: Owners,
    extra: dict[str, str] | None,
) -> dict[str, Any]:
    kind = _fs.kind_of(st, path)
    entry: dict[str, Any] = {
        "layer": layer,
        "path": path,
        "kind": kind.value,
        "mode": stat.S_IMODE(st.st_mode),
        "uid": owners.ids.index(st.st_uid),
        "gid": owners.ids.index(st.st_gid),
        "atime_ns": st.st_atime_ns,
        "mtime_ns": st.st_mtime_ns,
        "size": st.st_size if kind is Kind.FILE else 0,
        "xattrs": {},
    }
    entry.update(extra or {})
    return entry


def _encode(xattrs: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in sorted(xattrs.items())}


def _store_blob(src: int, blobs: int) -> str:
    digest = hashlib.sha256()
    temp = f".part-{os.getpid()}-{src}"
    dst = os.open(temp, _fs.CREATE_FLAGS, 0o600, dir_fd=blobs)
    try:
        offset = 0
        while chunk := os.pread(src, 1 << 20, offset):
            digest.update(chunk)
            os.write(dst, chunk)
            offset += len(chunk)
    finally:
        os.close(dst)
    name = digest.hexdigest()
    if _fs.lstat_at(blobs, name) is None:
        os.rename(temp, name, src_dir_fd=blobs, dst_dir_fd=blobs)
    else:
        os.unlink(temp, dir_fd=blobs)
    return name


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, _fs.CREATE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# -- populate ---------------------------------------------------------------------------------


def populate(
    source: Path,
    layers: Mapping[str, Path],
    owners: Sequence[int],
    key: bytes,
    context: bytes = b"",
) -> None:
    """Fill the empty live ``layers`` of a fresh volume from the export at ``source``,
    owned by ``owners`` (matched by index with the exporting sandbox's ids). Every file is
    a copy: independent of the export and of any other volume populated from it.
    ``context`` must be the one the export was sealed with (what it belongs to, e.g. the
    tenant and snapshot id): an export sealed for another is refused.

    Raises:
        SandboxError: the export is not one this key sealed for ``context``, or differs
            from its manifest in any way (the message names what failed), or the layers do
            not match it, or a layer is not empty, or writing failed. Nothing is left in
            the layers then (what was written is removed again).
    """
    ids = Owners(tuple(owners))
    src = _open_export(source)
    try:
        manifest = _verified_manifest(src, key, context, source)
        try:
            entries = _checked_entries(manifest, layers, len(ids.ids))
        except (KeyError, TypeError, AttributeError) as exc:
            raise SandboxError(f"the export {source} has a malformed manifest") from exc
        with _fs.opened_dir(src, BLOBS) as blobs:
            _verify_blobs(blobs, entries)
            live: dict[str, int] = {}
            try:
                for name, path in layers.items():
                    live[name] = os.open(path, _fs.DIR_FLAGS)
                for name, fd in live.items():
                    if _fs.names(fd):
                        raise SandboxError(f"the layer {name!r} to populate is not empty")
                _write_into(entries, live, blobs, ids, source)
            finally:
                for fd in live.values():
                    os.close(fd)
    except OSError as exc:
        raise SandboxError(f"cannot read the export {source}: {exc}") from exc
    finally:
        os.close(src)


def _write_into(
    entries: list[dict[str, Any]], live: dict[str, int], blobs: int, ids: Owners, source: Path
) -> None:
    """``_write_entries``, or on any failure the layers emptied again and ``SandboxError``."""
    try:
        _write_entries(entries, live, blobs, ids)
    except BaseException as exc:
        _clear(live)
        if isinstance(exc, OSError):
            raise SandboxError(f"cannot populate from {source}: {exc}") from exc
        raise


def _open_export(source: Path) -> int:
    try:
        fd = os.open(source, _fs.DIR_FLAGS)
    except OSError as exc:
        raise SandboxError(f"not an export: {source}: {exc.strerror}") from exc
    found = set(_fs.names(fd))
    if found != {MANIFEST, SEAL, BLOBS}:
        os.close(fd)
        raise SandboxError(f"the export {source} holds {sorted(found)}, not an export's files")
    return fd


def _read_regular(dir_fd: int, name: str, limit: int) -> bytes:
    try:
        fd = os.open(name, _fs.READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise SandboxError(f"the export's {name} cannot be read: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise SandboxError(f"the export's {name} is not a regular file of a sane size")
        return os.pread(fd, st.st_size + 1, 0)
    finally:
        os.close(fd)


def _verified_manifest(src: int, key: bytes, context: bytes, source: Path) -> dict[str, Any]:
    manifest = _read_regular(src, MANIFEST, _MAX_MANIFEST)
    sealed = _read_regular(src, SEAL, 128).decode(errors="replace").strip()
    if not hmac.compare_digest(sealed, seal(key, manifest, context)):
        raise SandboxError(f"the export {source} is not sealed by this server: its seal fails")
    try:
        parsed = json.loads(manifest)
    except ValueError as exc:
        raise SandboxError(f"the export {source} has a manifest that does not parse") from exc
    if not isinstance(parsed, dict) or parsed.get("format") != FORMAT:
        raise SandboxError(f"the export {source} has an unknown format")
    return parsed


def _checked_entries(
    manifest: dict[str, Any], layers: Mapping[str, Path], owners: int
) -> list[dict[str, Any]]:
    """The manifest's entries, each well formed, every parent a directory listed before
    it (sealed manifests are ours, but a bug must not become a write outside a layer)."""
    if sorted(manifest["layers"]) != sorted(layers):
        raise SandboxError(
            f"the export's layers {manifest['layers']} are not this sandbox's {list(layers)}"
        )
    seen: dict[tuple[str, str], str] = {}
    for entry in manifest["entries"]:
        layer, path = entry["layer"], entry["path"]
        parts = path.split("/") if path else []
        for part in parts:
            _fs.check_name(part, (layer,))
        parent = (layer, "/".join(parts[:-1]))
        if parts and seen.get(parent) != Kind.DIR.value:
            raise SandboxError(f"the export's entry {layer}/{path} has no directory above it")
        if (layer, path) in seen or (not parts and entry["kind"] != Kind.DIR.value):
            raise SandboxError(f"the export's entry {layer}/{path} is malformed")
        if not _well_formed(entry, owners):
            raise SandboxError(f"the export's entry {layer}/{path} is malformed")
        link = entry.get("link")
        if link is not None and (
            entry["kind"] != Kind.FILE.value or seen.get((layer, link)) != Kind.FILE.value
        ):
            raise SandboxError(f"the export's entry {layer}/{path} links to no file before it")
        # A hard link's target is a group's first file, never another link.
        seen[(layer, path)] = "link" if link is not None else entry["kind"]
    return list(manifest["entries"])


_KINDS = {k.value for k in Kind if k is not Kind.SKIPPED}


def _well_formed(entry: dict[str, Any], owners: int) -> bool:
    def whole(key: str, below: int) -> bool:
        value = entry.get(key)
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < below

    kind = entry.get("kind")
    xattrs = entry.get("xattrs")
    return (
        kind in _KINDS
        and whole("mode", 0o10000)
        and whole("uid", owners)
        and whole("gid", owners)
        and whole("size", 1 << 62)
        and whole("atime_ns", 1 << 63)
        and whole("mtime_ns", 1 << 63)
        and isinstance(xattrs, dict)
        and all(isinstance(k, str) and k.startswith(_fs.KEPT_XATTRS) for k in xattrs)
        and (kind != Kind.FILE.value or _SHA256.fullmatch(str(entry.get("sha256"))) is not None)
        and (kind != Kind.SYMLINK.value or isinstance(entry.get("target"), str))
    )


def _verify_blobs(blobs: int, entries: list[dict[str, Any]]) -> None:
    wanted = {e["sha256"]: e["size"] for e in entries if e["kind"] == Kind.FILE.value}
    found = set(_fs.names(blobs))
    if found != set(wanted):
        extra, missing = sorted(found - set(wanted)), sorted(set(wanted) - found)
        raise SandboxError(
            f"the export's files differ from its manifest: extra {extra}, missing {missing}"
        )
    for digest, size in wanted.items():
        st = os.stat(digest, dir_fd=blobs, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            raise SandboxError(f"the export's file {digest} is not the manifest's")
        # Its content is hashed as it is copied (``_write_entries``): read once.


def _write_entries(
    entries: list[dict[str, Any]], live: dict[str, int], blobs: int, owners: Owners
) -> None:
    """Write the checked ``entries`` (parents first) into the empty layers ``live``. Every
    entry is owned by its final owner before any data goes in; a file's blob is hashed as
    it is copied (read once); a directory's metadata is set last (its mtime). Holds one
    descriptor per level of the path being written, never one per directory."""
    dirs: list[tuple[str, str, dict[str, Any]]] = []
    cursor = _DirCursor(live)
    try:
        for entry in entries:
            layer, path = entry["layer"], entry["path"]
            uid, gid = owners.ids[entry["uid"]], owners.ids[entry["gid"]]
            if not path:
                dirs.append((layer, path, entry))
                continue
            parent_path, _, name = path.rpartition("/")
            parent = cursor.get(layer, parent_path)
            kind = Kind(entry["kind"])
            xattrs = {k: base64.b64decode(v) for k, v in entry["xattrs"].items()}
            if kind is Kind.DIR:
                os.mkdir(name, 0o700, dir_fd=parent)
                os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
                if xattrs:
                    _fs.write_xattrs(_fs.proc_path(parent, name), xattrs)
                dirs.append((layer, path, entry))
            elif kind is Kind.FILE and "link" in entry:
                first = entry["link"].split("/")
                with _fs.opened_path(live[layer], first[:-1]) as source:
                    os.link(
                        first[-1], name, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False
                    )
            elif kind is Kind.FILE:
                with _fs.opened_file(blobs, entry["sha256"], _stat_at(blobs, entry)) as src:
                    dst = os.open(name, _fs.CREATE_FLAGS, 0o600, dir_fd=parent)
                    try:
                        os.fchown(dst, uid, gid)
                        if _copy_hashing(src, dst) != entry["sha256"]:
                            raise SandboxError(
                                f"the export's file {entry['sha256']} was changed: its hash fails"
                            )
                        _fs.write_xattrs(dst, xattrs)
                        _meta_fd(dst, entry, uid, gid)
                    finally:
                        os.close(dst)
            else:
                if kind is Kind.SYMLINK:
                    os.symlink(entry["target"], name, dir_fd=parent)
                elif kind is Kind.WHITEOUT:
                    _fs.make_whiteout(parent, name)
                else:
                    raise SandboxError(f"the export's entry {layer}/{path} is malformed")
                os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
                if xattrs:
                    _fs.write_xattrs(_fs.proc_path(parent, name), xattrs)
                if kind is Kind.WHITEOUT:
                    os.chmod(name, entry["mode"], dir_fd=parent, follow_symlinks=False)
                times = (entry["atime_ns"], entry["mtime_ns"])
                os.utime(name, ns=times, dir_fd=parent, follow_symlinks=False)
        for layer, path, entry in reversed(dirs):
            fd = cursor.get(layer, path)
            _meta_fd(fd, entry, owners.ids[entry["uid"]], owners.ids[entry["gid"]])
    finally:
        cursor.close()


class _DirCursor:
    """One open directory of the layers being written, moved from one directory to the
    next by ``..`` and names: one descriptor however wide or deep the tree (entries come
    parents first, depth first, so each move is short). Safe on a fresh volume that no
    sandbox runs on yet: nothing else changes its tree meanwhile."""

    def __init__(self, live: dict[str, int]) -> None:
        self._live = live
        self._layer = ""
        self._parts: list[str] = []
        self._fd = -1  # ours when ``_parts`` is not empty

    def get(self, layer: str, path: str) -> int:
        """An fd of the directory ``layer``/``path``, valid until the next call."""
        parts = path.split("/") if path else []
        if layer != self._layer:
            self.close()
            self._layer = layer
        common = 0
        for mine, theirs in zip(self._parts, parts, strict=False):
            if mine != theirs:
                break
            common += 1
        if common == 0:
            self.close()
        for _ in range(len(self._parts) - common):
            self._move("..")
        for part in parts[common:]:
            self._move(part)
        return self._fd if self._parts else self._live[layer]

    def _move(self, name: str) -> None:
        here = self._fd if self._parts else self._live[self._layer]
        fd = os.open(name, _fs.DIR_FLAGS, dir_fd=here)
        if self._parts:
            os.close(self._fd)
        if name == "..":
            self._parts.pop()
        else:
            self._parts.append(name)
        if self._parts:
            self._fd = fd
        else:
            os.close(fd)  # back at the layer's root: its own fd serves

    def close(self) -> None:
        if self._parts:
            os.close(self._fd)
        self._parts = []


def _copy_hashing(src: int, dst: int) -> str:
    """Copy ``src`` into ``dst`` from offset 0; the sha256 of the bytes written."""
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(src, 1 << 20, offset):
        digest.update(chunk)
        os.pwrite(dst, chunk, offset)
        offset += len(chunk)
    return digest.hexdigest()


def _clear(live: dict[str, int]) -> None:
    """Remove everything a failed populate wrote (the layers were empty before it)."""
    for fd in live.values():
        for name in _fs.names(fd):
            _fs.remove_tree(fd, name)


def _stat_at(dir_fd: int, entry: dict[str, Any]) -> os.stat_result:
    return os.stat(entry["sha256"], dir_fd=dir_fd, follow_symlinks=False)


def _meta_fd(fd: int, entry: dict[str, Any], uid: int, gid: int) -> None:
    os.fchown(fd, uid, gid)
    os.fchmod(fd, entry["mode"])
    os.utime(fd, ns=(entry["atime_ns"], entry["mtime_ns"]))
