"""The root filesystem of a local sandbox: which host paths appear where, read-only (a
sandbox with a volume sees the directories among them as overlays: ``overlaid``, ``volume``).

``host`` shows the host's system directories (``/usr``, ``/bin``, ``/lib``...) and a copy of a
short allowlist of ``/etc`` entries, taken when the backend starts (one bind instead of dozens:
each bind costs bubblewrap a pass over the mount table); nothing else of the host (no
``/home``, ``/root``, ``/var``, ``/run``, ``/tmp``) is visible. A directory root filesystem
(one built with debootstrap, say) shows its own top-level directories. Either way
``/etc/passwd``, ``group``, ``hosts`` and ``hostname`` come from files Ringfence generates,
so the sandbox user has a name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ringfence.errors import InvalidRequest

__all__ = [
    "GENERATED_ETC",
    "Entry",
    "Kind",
    "RuntimeFiles",
    "layout_for",
    "materialize",
    "overlaid",
    "prepare_runtime_dir",
    "prepare_runtime_files",
]

HOST_IMAGE = "host"

_HOST_TOP_LEVEL = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_HOST_ETC = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "fonts",
    "gai.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "login.defs",
    "magic",
    "magic.mime",
    "matplotlibrc",  # Debian's matplotlib reads its defaults from here
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "profile",
    "protocols",
    "python3",
    "python3.11",
    "services",
    "ssl",
    "timezone",
    "xdg",
)
# Top-level directories of a directory rootfs that the sandbox provides itself.
_OWN_TOP_LEVEL = frozenset({"proc", "dev", "sys", "tmp", "run", "home", "etc", "mnt", "media"})

GENERATED_ETC = {
    "passwd": (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        "user:x:1000:1000:Sandbox user:/home/user:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "hostname": "sandbox\n",
}


class Kind(StrEnum):
    RO_BIND = "ro-bind"
    SYMLINK = "symlink"
    DIR = "dir"


@dataclass(frozen=True)
class Entry:
    """One step of building the sandbox's root: bind ``source`` (or link to it) at ``target``."""

    kind: Kind
    source: str
    target: str


@dataclass(frozen=True)
class RuntimeFiles:
    """Files the backend prepared for sandboxes to bind read-only."""

    generated_etc: Path  # passwd, group, hosts, hostname
    host_etc: Path  # the allowlisted host /etc entries plus the generated files


def prepare_runtime_dir(runtime_dir: Path) -> None:
    """Create ``runtime_dir`` (0755) unless it exists, and check that it is ours and that no
    other user can write it: what is found in it is trusted.

    Raises:
        OSError: it cannot be made, or it is not ours alone (``PermissionError``).
    """
    if os.path.lexists(runtime_dir):
        _check_ours(runtime_dir)  # found, not made: trusted only if nobody else could write it
    runtime_dir.mkdir(parents=True, exist_ok=True)
    runtime_dir.chmod(0o755)
    _check_ours(runtime_dir)


def prepare_runtime_files(runtime_dir: Path, host_etc: Path = Path("/etc")) -> RuntimeFiles:
    """Write the generated ``/etc`` files and the host ``/etc`` copy under ``runtime_dir``.

    Everything is world-readable: the unprivileged sandbox user binds it. A directory's name
    is a fingerprint of its sources, so a copy is made only when the host's files change, and
    a running sandbox's files never change under it.

    Raises:
        OSError: the directory cannot be written.
    """
    prepare_runtime_dir(runtime_dir)
    generated_digest = hashlib.sha256(repr(sorted(GENERATED_ETC.items())).encode())
    generated = materialize(runtime_dir, "generated", generated_digest, _write_generated)
    sources = [host_etc / name for name in _HOST_ETC]
    etc_digest = _fingerprint(sources, generated_digest.copy())

    def build_etc(directory: Path) -> None:
        for source in sources:
            if not source.is_symlink() and not (source.exists() and _world_readable(source)):
                continue
            if source.is_symlink() or source.is_file():
                shutil.copy2(source, directory / source.name, follow_symlinks=False)
            elif source.is_dir():
                shutil.copytree(
                    source, directory / source.name, symlinks=True, ignore=_private_entries
                )
        _write_generated(directory)

    return RuntimeFiles(generated, materialize(runtime_dir, "etc", etc_digest, build_etc))


def _check_ours(directory: Path) -> None:
    """Refuse a runtime directory another user could have prepared or could change: what
    is found in it (the daemon's code, the /etc copies, the daemon sockets) is trusted.

    Raises:
        PermissionError: it is a symlink, not ours, or writable by others.
    """
    st = directory.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{directory} is not a directory (a symlink?)")
    if st.st_uid != os.geteuid():
        raise PermissionError(
            f"{directory} belongs to uid {st.st_uid}, not to us (uid {os.geteuid()}): "
            "another user could have planted files in it"
        )
    if st.st_mode & 0o022:
        raise PermissionError(f"{directory} is writable by other users")


def _write_generated(directory: Path) -> None:
    for name, content in GENERATED_ETC.items():
        (directory / name).write_text(content)
        (directory / name).chmod(0o644)


def _world_readable(path: Path) -> bool:
    """Whether any local user may read ``path`` (and enter it, for a directory)."""
    mode = path.lstat().st_mode
    need = 0o005 if path.is_dir() else 0o004
    return mode & need == need


def _private_entries(directory: str, names: list[str]) -> set[str]:
    # Only what every local user may read is copied: /etc/ssl/private stays on the host.
    return {
        n
        for n in names
        if not os.path.islink(os.path.join(directory, n))
        and not _world_readable(Path(directory, n))
    }


def _fingerprint(sources: list[Path], digest: hashlib._Hash) -> hashlib._Hash:
    """Digest of the metadata (not the content) of every file under ``sources``."""
    for source in sources:
        paths = [source]
        if source.is_dir() and not source.is_symlink():
            for root, dirs, files in os.walk(source):
                paths += (Path(root, name) for name in sorted(dirs + files))
        for path in paths:
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            link = os.readlink(path) if path.is_symlink() else ""
            line = f"{path}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{link}\n"
            digest.update(line.encode())
    return digest


def materialize(
    runtime_dir: Path, name: str, digest: hashlib._Hash, build: Callable[[Path], None]
) -> Path:
    """``runtime_dir/<name>-<digest>``, built by ``build`` in a temporary directory first
    unless it exists: a copy in use never changes, and concurrent builders do not clash."""
    final = runtime_dir / f"{name}-{digest.hexdigest()[:16]}"
    if final.is_dir():
        return final
    with tempfile.TemporaryDirectory(dir=runtime_dir) as tmp:
        built = Path(tmp, name)
        built.mkdir()
        build(built)  # copies keep their modes: the sources were world-readable
        built.chmod(0o755)
        try:
            built.rename(final)
        except OSError:
            if not final.is_dir():  # lost a race to an identical copy: fine
                raise
    return final


def layout_for(image: str, files: RuntimeFiles) -> tuple[Entry, ...]:
    """The entries that build the root for ``image``.

    Raises:
        InvalidRequest: ``image`` is neither ``host`` nor a directory root filesystem.
    """
    if image == HOST_IMAGE:
        return _host_layout(files)
    if not image.startswith("/"):
        raise InvalidRequest(
            f"unknown image {image!r}: the local backend takes 'host' or the absolute path "
            "of a directory root filesystem"
        )
    root = Path(image)
    if not (root / "usr").is_dir() and not (root / "bin").is_dir():
        raise InvalidRequest(f"{image} is not a directory root filesystem (no usr/ or bin/)")
    top = tuple(sorted(name for name in os.listdir(root) if name not in _OWN_TOP_LEVEL))
    entries = [e for name in top if (e := _entry(os.path.join(image, name), "/" + name))]
    etc = root / "etc"
    if etc.is_dir() and not etc.is_symlink():
        # The image's own /etc, with the generated files bound over those it has.
        entries.append(Entry(Kind.RO_BIND, str(etc), "/etc"))
        generated = [name for name in GENERATED_ETC if (etc / name).is_file()]
    else:
        entries.append(Entry(Kind.DIR, "", "/etc"))
        generated = list(GENERATED_ETC)
    entries += [Entry(Kind.RO_BIND, str(files.generated_etc / n), "/etc/" + n) for n in generated]
    return tuple(entries)


def overlaid(layout: tuple[Entry, ...]) -> tuple[tuple[str, str], ...]:
    """The ``(source, target)`` of every directory of ``layout`` that a sandbox with a
    volume sees as an overlay (writable, its writes in its own upper layer): each bound
    directory. Bound files (the generated ``/etc`` entries of a directory root filesystem)
    and symlinks stay as they are."""
    return tuple(
        (e.source, e.target)
        for e in layout
        if e.kind is Kind.RO_BIND and os.path.isdir(e.source) and not os.path.islink(e.source)
    )


def _host_layout(files: RuntimeFiles) -> tuple[Entry, ...]:
    entries = [e for name in _HOST_TOP_LEVEL if (e := _entry("/" + name, "/" + name))]
    entries.append(Entry(Kind.RO_BIND, str(files.host_etc), "/etc"))
    entries += [Entry(Kind.DIR, "", "/var"), Entry(Kind.SYMLINK, "../tmp", "/var/tmp")]
    return tuple(entries)


def _entry(source: str, target: str) -> Entry | None:
    if os.path.islink(source):
        return Entry(Kind.SYMLINK, os.readlink(source), target)
    if os.path.exists(source):
        return Entry(Kind.RO_BIND, source, target)
    return None
