"""Volumes (real tmpfs mounts) and a full picture of a tree's state, for the snapshot tests."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ringfence.backends.local.snapshots import SnapshotStore

U = 61_234  # the sandbox's host ids (its root, and its user)
OWNERS = (U, U + 1)
KEY = b"k" * 32
KEPT = ("user.", "trusted.overlay.")


@pytest.fixture(autouse=True)
def stores_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every store a test makes is closed after it (import this into a test module): an
    open store keeps its detached tmpfs alive, which later tests in the same process see
    (tests/integration/test_local_state.py counts the server's descriptors into one)."""
    made: list[SnapshotStore] = []
    original = SnapshotStore.__init__

    def init(self: SnapshotStore, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(SnapshotStore, "__init__", init)
    yield
    for store in made:
        store.close()


@contextlib.contextmanager
def tmpfs(where: Path, size: str = "512m") -> Iterator[Path]:
    where.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)], check=True
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)
        where.rmdir()


@dataclass
class Volume:
    root: Path
    layers: dict[str, Path]

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    @classmethod
    def create(cls, root: Path, names: tuple[str, ...]) -> Volume:
        layers = {}
        for name in names:
            layers[name] = root / name
            layers[name].mkdir()
            os.chown(layers[name], U, U)
        (root / "snapshots").mkdir(mode=0o700)
        return cls(root, layers)


def make(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)


def chown_tree(root: Path, uid: int = U) -> None:
    """Give everything under ``root`` (but its snapshots) to the sandbox, as it made them
    (setuid bits included: chown clears them, so they are put back)."""
    for directory, dirs, files in os.walk(root):
        if Path(directory) == root and "snapshots" in dirs:
            dirs.remove("snapshots")
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            os.chown(path, uid, uid, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(st.st_mode))


def state_of(layers: Mapping[str, Path]) -> dict[str, tuple[object, ...]]:
    """Everything a rollback must bring back, per entry: kind, mode, owner, size, mtime,
    content hash or link target, nlink of files, kept xattrs (not atime, ctime, inode)."""
    state: dict[str, tuple[object, ...]] = {}
    for name, layer in layers.items():
        for directory, dirs, files in os.walk(layer):
            for entry in sorted(dirs + files):
                path = os.path.join(directory, entry)
                state[f"{name}/{os.path.relpath(path, layer)}"] = _entry_state(path)
        state[name] = _entry_state(str(layer))
    return state


def _entry_state(path: str) -> tuple[object, ...]:
    st = os.lstat(path)
    mode = st.st_mode
    if stat.S_ISREG(mode):
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as f:
            detail: object = hashlib.sha256(f.read()).hexdigest()
    elif stat.S_ISLNK(mode):
        detail = os.readlink(path)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        detail = st.st_rdev
    else:
        detail = None
    follow = not stat.S_ISLNK(mode)
    try:
        keys = os.listxattr(path, follow_symlinks=follow)
    except OSError:
        keys = []
    xattrs = tuple(
        sorted(
            (k, os.getxattr(path, k, follow_symlinks=follow)) for k in keys if k.startswith(KEPT)
        )
    )
    nlink = st.st_nlink if not stat.S_ISDIR(mode) else None
    size = st.st_size if not stat.S_ISDIR(mode) else None
    return (mode, st.st_uid, st.st_gid, size, st.st_mtime_ns, detail, nlink, xattrs)
