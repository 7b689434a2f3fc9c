"""Importing a ``docker save`` archive (or any OCI image layout in a tar) as a template.

Two layouts are read:
- Docker's: ``manifest.json``, a list with one image whose ``Layers`` name layer tars inside
  the archive (``<id>/layer.tar`` in older Docker, ``blobs/sha256/<hex>`` since Docker 25);
- OCI's: ``index.json`` pointing (perhaps through a nested index) at one image manifest
  whose ``layers`` are blobs ``blobs/sha256/<hex>``; their digests are checked.
``manifest.json`` is preferred when both exist (Docker 25 writes both). The layers are
applied in order by ``layers.apply_layer``; the outer archive is never extracted as such.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ringfence.errors import InvalidRequest
from ringfence.templates.layers import apply_layer, entry_parts

__all__ = ["ImageArchive", "import_archive"]

_INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_MAX_JSON_BYTES = 4 << 20


@dataclass(frozen=True)
class ImageArchive:
    """What an archive holds: its layout, its layers (member names, bottom first), and the
    digests those layers must have (OCI layout only)."""

    layout: str
    layers: tuple[str, ...]
    tags: tuple[str, ...] = ()
    digests: dict[str, str] = field(default_factory=dict)


def import_archive(archive: Path, rootfs: Path) -> dict[str, Any]:
    """Apply every layer of ``archive`` to the empty directory ``rootfs``; return metadata
    (layout, tags, number of layers, what was skipped).

    Raises:
        InvalidRequest: not a tar, no image in it, a missing or corrupt layer, or an entry
            that tries to leave the root filesystem.
    """
    counts: Counter[str] = Counter()
    rootfs.mkdir(mode=0o755, exist_ok=True)
    with _open_tar(archive) as outer:
        image = read_image(outer)
        for name in image.layers:
            with _member(outer, name) as blob:
                if name in image.digests:
                    _check_digest(blob, image.digests[name], name)
                try:
                    with tarfile.open(fileobj=blob, mode="r:*") as layer:
                        apply_layer(layer, str(rootfs), counts)
                except tarfile.TarError as exc:
                    raise InvalidRequest(
                        f"layer {name} is not a tar archive (gzip and uncompressed "
                        "layers are supported)"
                    ) from exc
    if not any((rootfs / top).is_dir() for top in ("usr", "bin")):
        raise InvalidRequest(f"{archive}: the image has neither usr/ nor bin/ at its root")
    return {
        "source": "import",
        "archive": str(archive),
        "layout": image.layout,
        "tags": list(image.tags),
        "layers": len(image.layers),
        "whiteouts": counts["whiteouts"],
        "skipped_devices": counts["devices"],
        "skipped_other": counts["skipped"],
        "stripped_setuid": counts["setuid"],
    }


def read_image(outer: tarfile.TarFile) -> ImageArchive:
    """The image in an opened archive.

    Raises:
        InvalidRequest: neither layout is there, or it does not hold exactly one image.
    """
    names = {name.removeprefix("./") for name in outer.getnames()}
    if "manifest.json" in names:
        manifest = _json(outer, "manifest.json")
        if not isinstance(manifest, list) or len(manifest) != 1:
            count = len(manifest) if isinstance(manifest, list) else "no"
            raise InvalidRequest(f"manifest.json lists {count} images; import one at a time")
        entry = manifest[0]
        layers = entry.get("Layers") if isinstance(entry, dict) else None
        if not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
            raise InvalidRequest("manifest.json: the image has no list of Layers")
        tags = entry.get("RepoTags") or []
        return ImageArchive("docker", tuple(_normal(x) for x in layers), tuple(map(str, tags)))
    if "index.json" in names:
        manifest = _image_manifest(outer, _json(outer, "index.json"), depth=0)
        layers = manifest.get("layers")
        if not isinstance(layers, list):
            raise InvalidRequest("the OCI image manifest has no layers")
        digests = {_blob(d): d for d in (_digest_of(layer) for layer in layers)}
        return ImageArchive("oci", tuple(digests), digests=digests)
    raise InvalidRequest(
        "not an image archive: no manifest.json (docker save) or index.json (OCI layout) in it"
    )


def _image_manifest(outer: tarfile.TarFile, index: Any, depth: int) -> dict[str, Any]:
    if depth > 4:
        raise InvalidRequest("index.json: indexes nested too deep")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or not manifests:
        raise InvalidRequest("index.json lists no image manifest")
    if len(manifests) > 1:
        manifests = [m for m in manifests if _platform(m) in ("", "linux/amd64")]
        if len(manifests) != 1:
            raise InvalidRequest("the archive holds several images; import one at a time")
    descriptor = manifests[0]
    digest = _digest_of(descriptor)
    with _member(outer, _blob(digest)) as blob:
        data = _check_digest(blob, digest, _blob(digest), keep=True)
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise InvalidRequest(f"{_blob(digest)} is not JSON") from exc
    if descriptor.get("mediaType") in _INDEX_TYPES or document.get("manifests"):
        return _image_manifest(outer, document, depth + 1)
    if not isinstance(document, dict):
        raise InvalidRequest(f"{_blob(digest)} is not an image manifest")
    return document


def _platform(descriptor: Any) -> str:
    platform = descriptor.get("platform") if isinstance(descriptor, dict) else None
    if not isinstance(platform, dict):
        return ""
    return f"{platform.get('os', '')}/{platform.get('architecture', '')}"


def _digest_of(descriptor: Any) -> str:
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise InvalidRequest(f"unsupported or malformed digest {digest!r} (sha256 only)")
    return digest


def _blob(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


def _normal(name: str) -> str:
    return "/".join(entry_parts(name))


def _check_digest(blob: IO[bytes], digest: str, name: str, *, keep: bool = False) -> bytes:
    hasher = hashlib.sha256()
    kept = bytearray()
    while chunk := blob.read(1 << 20):
        hasher.update(chunk)
        if keep:
            kept += chunk
            if len(kept) > _MAX_JSON_BYTES:
                raise InvalidRequest(f"{name} is too large for a manifest")
    if "sha256:" + hasher.hexdigest() != digest:
        raise InvalidRequest(f"{name} does not match its digest {digest}: corrupt archive")
    blob.seek(0)
    return bytes(kept)


def _json(outer: tarfile.TarFile, name: str) -> Any:
    with _member(outer, name) as f:
        data = f.read(_MAX_JSON_BYTES + 1)
    if len(data) > _MAX_JSON_BYTES:
        raise InvalidRequest(f"{name} is too large")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise InvalidRequest(f"{name} is not JSON: {exc}") from exc


def _member(outer: tarfile.TarFile, name: str) -> IO[bytes]:
    f = None
    for candidate in (name, "./" + name):  # `tar -C dir -cf image.tar .` writes ./names
        try:
            f = outer.extractfile(candidate)  # follows links between members, never outside
        except KeyError:
            continue
        break
    if f is None:
        raise InvalidRequest(f"the archive lacks {name}, which its manifest names")
    return f


def _open_tar(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, mode="r:*")
    except FileNotFoundError:
        raise InvalidRequest(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidRequest(f"{path} is a directory, not an image archive") from None
    except (tarfile.TarError, OSError) as exc:
        raise InvalidRequest(f"{path} is not a tar archive (docker save output)") from exc
