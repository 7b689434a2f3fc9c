"""Build ``docker save`` and OCI image archives in tests, from real files."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    """One entry of a layer: kind is file, dir, symlink, hardlink or chr."""

    name: str
    kind: str = "file"
    data: bytes = b""
    mode: int = 0o644
    target: str = ""


def layer(entries: list[Entry]) -> bytes:
    """An uncompressed layer tar holding ``entries`` in order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.mode = entry.mode
            info.uid = info.gid = 4242  # never kept
            info.mtime = 1_700_000_000
            if entry.kind == "file":
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "chr": tarfile.CHRTYPE,
            }[entry.kind]
            info.linkname = entry.target
            if entry.kind == "chr":
                info.devmajor, info.devminor = 1, 3
            tar.addfile(info)
    return buffer.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def docker_archive(
    path: Path, layers: list[bytes], tag: str = "test/image:latest", prefix: str = ""
) -> Path:
    """The legacy ``docker save`` layout: manifest.json naming ``<id>/layer.tar``; members
    named ``prefix + name`` (``./`` as ``tar -C dir -cf x.tar .`` writes them)."""
    with tarfile.open(path, "w") as tar:
        names = []
        for data in layers:
            name = f"{hashlib.sha256(data).hexdigest()}/layer.tar"
            _add(tar, prefix + name, data)
            names.append(name)
        config = json.dumps({"architecture": "amd64", "os": "linux"}).encode()
        _add(tar, prefix + "config.json", config)
        manifest = [{"Config": "config.json", "RepoTags": [tag], "Layers": names}]
        _add(tar, prefix + "manifest.json", json.dumps(manifest).encode())
    return path


def oci_archive(path: Path, layers: list[bytes], *, nested: bool = True) -> Path:
    """The OCI layout: index.json -> (an index ->) a manifest -> blobs/sha256/<hex>."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> str:
        digest = _digest(data)
        blobs[digest] = data
        return digest

    config = blob(json.dumps({"architecture": "amd64", "os": "linux"}).encode())
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config, "size": len(blobs[config])},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": blob(d),
                 "size": len(d)}
                for d in layers
            ],
        }
    ).encode()  # fmt: skip
    top = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": blob(manifest),
           "size": len(manifest),
           "platform": {"os": "linux", "architecture": "amd64"}}  # fmt: skip
    if nested:
        inner = json.dumps({"schemaVersion": 2, "manifests": [top]}).encode()
        top = {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": blob(inner),
               "size": len(inner)}  # fmt: skip
    with tarfile.open(path, "w") as tar:
        _add(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        _add(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": [top]}).encode())
        for digest, data in blobs.items():
            _add(tar, "blobs/sha256/" + digest.removeprefix("sha256:"), data)
    return path


def busybox_layers() -> list[bytes]:
    """Two layers: busybox and a few files, then whiteouts and an opaque directory."""
    busybox = Path("/bin/busybox").read_bytes()
    first = [
        Entry("bin", "dir", mode=0o755),
        Entry("bin/busybox", data=busybox, mode=0o4755),  # setuid: must be dropped
        *(Entry(f"bin/{a}", "symlink", target="busybox") for a in ("sh", "ls", "cat", "id")),
        Entry("bin/test", "hardlink", target="bin/busybox"),
        Entry("etc", "dir", mode=0o755),
        Entry("etc/gone.txt", data=b"deleted by the second layer\n"),
        Entry("etc/kept.txt", data=b"first\n"),
        Entry("opaque", "dir", mode=0o755),
        Entry("opaque/old.txt", data=b"hidden by the opaque marker\n"),
        Entry("private", "dir", mode=0o700),
        Entry("private/secret", data=b"readable now\n", mode=0o600),
        Entry("dev", "dir", mode=0o755),
        Entry("dev/null", "chr", mode=0o666),
    ]
    second = [
        Entry("etc/.wh.gone.txt"),
        Entry("etc/kept.txt", data=b"second\n"),
        Entry("opaque/new.txt", data=b"from the second layer\n"),
        Entry("opaque/.wh..wh..opq"),  # after new.txt: it must still not hide it
    ]
    return [layer(first), layer(second)]
