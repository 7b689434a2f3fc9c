"""Exports of checkpoints and the volumes populated from them: copies everywhere (no link into
any volume), owners mapped to the new sandbox's ids, and a tampered export refused whole."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ringfence.backends.local.snapshots import Budget, SnapshotStore, populate
from ringfence.errors import SandboxError
from tests.backends.snapshot_helpers import (  # noqa: F401 (stores_closed: autouse)
    KEY,
    OWNERS,
    U,
    Volume,
    chown_tree,
    make,
    state_of,
    stores_closed,
    tmpfs,
)

LAYERS = ("workspace", "tmp", "usr")
CHILD = (U + 100, U + 101)  # a fork child's host ids


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Volume]:
    with tmpfs(tmp_path / "vol") as root:
        yield Volume.create(root, LAYERS)


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Callable[[str], Volume]]:
    """Empty volumes for children, as many as a test asks for."""
    with contextlib.ExitStack() as mounted:

        def make_volume(name: str) -> Volume:
            volume = Volume.create(mounted.enter_context(tmpfs(tmp_path / name)), LAYERS)
            for layer in volume.layers.values():
                os.chown(layer, CHILD[0], CHILD[0])
            return volume

        yield make_volume


def _tree(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    make(ws / "a.txt", b"alpha")
    make(ws / "same-1", b"identical content")
    make(ws / "same-2", b"identical content")
    make(ws / "src" / "big.bin", os.urandom(1 << 20))
    make(ws / "tool", b"#!/bin/sh\n", mode=0o4755)
    os.symlink("/etc/shadow", ws / "shadow")
    os.setxattr(ws / "a.txt", "user.note", b"kept")
    make(volume.layers["tmp"] / "t", b"tmp")
    os.link(ws / "a.txt", ws / "src" / "a-link")  # a hard-link group, kept as one
    usr = volume.layers["usr"]
    make(usr / "lib" / "new.so", b"\x7fELF")
    os.mknod(usr / "gone", stat.S_IFCHR | 0o600, os.makedev(0, 0))  # a whiteout
    os.setxattr(usr / "lib", "trusted.overlay.opaque", b"y")
    chown_tree(volume.root)
    os.chown(ws / "src", U + 1, U + 1)  # the sandbox's user, not its root


def _exported(volume: Volume, target: Path) -> None:
    store = SnapshotStore(volume.snapshots, volume.layers, OWNERS, Budget(4, 1 << 30), KEY)
    store.export(store.take().id, target)


def _mapped(state: dict[str, tuple[object, ...]]) -> dict[str, tuple[object, ...]]:
    ids = dict(zip(OWNERS, CHILD, strict=True))
    return {k: (v[0], ids[v[1]], ids[v[2]], *v[3:]) for k, v in state.items()}  # type: ignore[index]


def test_an_export_is_plain_copies_and_populates_a_fresh_volume(
    volume: Volume, fresh: Callable[[str], Volume], tmp_path: Path
) -> None:
    _tree(volume)
    target = tmp_path / "export"
    _exported(volume, target)
    for directory, dirs, files in os.walk(target):
        for name in dirs + files:
            st = os.lstat(os.path.join(directory, name))
            assert stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
            assert st.st_uid == 0 and not st.st_mode & 0o7077
            assert stat.S_ISDIR(st.st_mode) or st.st_nlink == 1
    assert len(os.listdir(target / "blobs")) == 6, "one blob per distinct content"

    one, two = fresh("one"), fresh("two")
    for child in (one, two):
        populate(target, child.layers, CHILD, KEY)
        assert state_of(child.layers) == _mapped(state_of(volume.layers))
        ws = child.layers["workspace"]
        assert os.stat(ws / "a.txt").st_ino == os.stat(ws / "src" / "a-link").st_ino
    # Copies: a child's change reaches neither the other child nor the export.
    (one.layers["workspace"] / "a.txt").write_bytes(b"changed in one")
    assert (two.layers["workspace"] / "a.txt").read_bytes() == b"alpha"
    populate(target, fresh("three").layers, CHILD, KEY)  # still verifies: unchanged


def _edit_blob(target: Path) -> None:
    blob = sorted((target / "blobs").iterdir())[0]
    data = bytearray(blob.read_bytes())
    data[0] ^= 1
    blob.write_bytes(bytes(data))


def _add_blob(target: Path) -> None:
    (target / "blobs" / ("0" * 64)).write_bytes(b"extra")


def _remove_blob(target: Path) -> None:
    sorted((target / "blobs").iterdir())[0].unlink()


def _edit_manifest(target: Path) -> None:
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["entries"][1]["mode"] = 0o4777
    (target / "manifest.json").write_text(json.dumps(manifest))


def _symlink_blob(target: Path) -> None:
    # A link to a file of the very same content: following it would verify.
    blob = sorted((target / "blobs").iterdir())[0]
    outside = target.parent / "same-content"
    outside.write_bytes(blob.read_bytes())
    blob.unlink()
    blob.symlink_to(outside)


def _extra_top_level(target: Path) -> None:
    (target / "notes").write_text("extra")


def _swap_manifest(target: Path) -> None:
    # A manifest and seal the key really made, from another export: its files differ.
    other = target.parent / "other-export"
    for name in ("manifest.json", "seal"):
        (target / name).write_bytes((other / name).read_bytes())


TAMPERING = {
    "a byte of a file changed": _edit_blob,
    "a file added": _add_blob,
    "a file removed": _remove_blob,
    "the manifest edited": _edit_manifest,
    "a symlink planted for a file": _symlink_blob,
    "an extra file beside the manifest": _extra_top_level,
    "another export's manifest": _swap_manifest,
}


@pytest.mark.parametrize("tamper", list(TAMPERING))
def test_a_tampered_export_is_refused_and_nothing_of_it_used(
    volume: Volume, fresh: Callable[[str], Volume], tmp_path: Path, tamper: str
) -> None:
    _tree(volume)
    _exported(volume, tmp_path / "export")
    if tamper == "another export's manifest":
        (volume.layers["tmp"] / "t").write_bytes(b"other")
        _exported(volume, tmp_path / "other-export")
    TAMPERING[tamper](tmp_path / "export")
    child = fresh("child")
    with pytest.raises(SandboxError) as exc:
        populate(tmp_path / "export", child.layers, CHILD, KEY)
    assert exc.value.code == "sandbox_error"
    assert all(os.listdir(layer) == [] for layer in child.layers.values())


def test_an_export_under_another_key_is_refused(
    volume: Volume, fresh: Callable[[str], Volume], tmp_path: Path
) -> None:
    _tree(volume)
    _exported(volume, tmp_path / "export")
    with pytest.raises(SandboxError):
        populate(tmp_path / "export", fresh("child").layers, CHILD, b"another key" * 3)


def test_populate_wants_empty_layers_of_the_same_names(
    volume: Volume, fresh: Callable[[str], Volume], tmp_path: Path
) -> None:
    _tree(volume)
    _exported(volume, tmp_path / "export")
    child = fresh("child")
    make(child.layers["tmp"] / "already", b"here")
    with pytest.raises(SandboxError):
        populate(tmp_path / "export", child.layers, CHILD, KEY)
    other = fresh("other")
    with pytest.raises(SandboxError):
        populate(tmp_path / "export", {"workspace": other.layers["workspace"]}, CHILD, KEY)
    assert os.listdir(other.layers["workspace"]) == []


def test_an_export_needs_a_new_directory(volume: Volume, tmp_path: Path) -> None:
    _tree(volume)
    (tmp_path / "export").mkdir()
    with pytest.raises(SandboxError):
        _exported(volume, tmp_path / "export")
    assert os.listdir(tmp_path / "export") == []


def test_a_sealed_but_malformed_manifest_is_refused(
    volume: Volume, fresh: Callable[[str], Volume], tmp_path: Path
) -> None:
    # Sealed with the right key (as a bug of ours could): still checked entry by entry.
    from ringfence.backends.local.snapshots._export import seal

    _tree(volume)
    target = tmp_path / "export"
    _exported(volume, target)
    original = json.loads((target / "manifest.json").read_text())
    for change in (
        lambda m: m["entries"][1].update(path="../../escape"),
        lambda m: m["entries"][1].update(uid=7),
        lambda m: m["entries"].append({"layer": "tmp", "path": "x/y", "kind": "file"}),
        lambda m: m.pop("entries"),
    ):
        manifest = json.loads(json.dumps(original))
        change(manifest)
        data = json.dumps(manifest).encode()
        (target / "manifest.json").write_bytes(data)
        (target / "seal").write_text(seal(KEY, data))
        child = fresh(f"child-{len(os.listdir(tmp_path))}")
        with pytest.raises(SandboxError):
            populate(target, child.layers, CHILD, KEY)
        assert all(os.listdir(layer) == [] for layer in child.layers.values())


def test_an_export_is_bound_to_the_context_it_was_sealed_for(
    volume: Volume, fresh: Callable[[str], Volume], tmp_path: Path
) -> None:
    _tree(volume)
    store = SnapshotStore(volume.snapshots, volume.layers, OWNERS, Budget(4, 1 << 30), KEY)
    store.export(store.take().id, tmp_path / "export", context=b"tenant-a/snap-1")
    for wrong in (b"", b"tenant-b/snap-1", b"tenant-a/snap-2"):
        child = fresh(f"child-{len(wrong)}-{wrong[-1:].hex()}")
        with pytest.raises(SandboxError, match="seal"):
            populate(tmp_path / "export", child.layers, CHILD, KEY, context=wrong)
    populate(tmp_path / "export", fresh("right").layers, CHILD, KEY, context=b"tenant-a/snap-1")


def test_a_full_volume_while_populating_leaves_nothing_in_the_layers(
    volume: Volume, tmp_path: Path
) -> None:
    _tree(volume)
    _exported(volume, tmp_path / "export")
    with tmpfs(tmp_path / "small", size="512k") as root:  # the export holds 1 MiB
        child = Volume.create(root, LAYERS)
        with pytest.raises(SandboxError, match="populate"):
            populate(tmp_path / "export", child.layers, CHILD, KEY)
        assert all(os.listdir(layer) == [] for layer in child.layers.values())


POPULATE_UNDER_FD_LIMIT = """
import resource, sys
from pathlib import Path
from ringfence.backends.local.snapshots import populate
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
layers = {name: Path(sys.argv[2]) / name for name in ("workspace", "tmp", "usr")}
populate(Path(sys.argv[1]), layers, (int(sys.argv[3]), int(sys.argv[4])), b"k" * 32)
"""


def test_populate_holds_no_descriptor_per_directory(
    volume: Volume, fresh: Callable[[str], Volume], tmp_path: Path
) -> None:
    """Review I4: 10,000 sibling directories and 500 nested ones (a checkpoint takes up
    to 512) populate with a 256-fd limit (it held one descriptor per directory: EMFILE,
    a raw OSError)."""
    ws = volume.layers["workspace"]
    for i in range(10_000):
        (ws / "wide" / f"d{i}").mkdir(parents=True)
    make(ws / "wide" / "d9999" / "last", b"last")
    deep = ws / "deep"
    for i in range(500):
        deep = deep / f"n{i}"
    make(deep / "bottom", b"bottom")
    chown_tree(volume.root)
    _exported(volume, tmp_path / "export")
    child = fresh("child")
    subprocess.run(
        [
            sys.executable,
            "-c",
            POPULATE_UNDER_FD_LIMIT,
            str(tmp_path / "export"),
            str(child.root),
            str(CHILD[0]),
            str(CHILD[1]),
        ],
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert _mapped(state_of(volume.layers)) == state_of(child.layers)
