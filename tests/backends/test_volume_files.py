"""``backends.local.volume_files`` on a plain directory (no mount needed): the no-follow walk,
what it refuses, what it writes, and the tar stream."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from ringfence.backends.local import volume_files as vf
from ringfence.errors import Conflict, InvalidRequest, NotFound, RingfenceError
from ringfence.models import VolumeEntry


@pytest.fixture
def root(tmp_path: Path) -> Path:
    volume = tmp_path / "volume"
    volume.mkdir()
    return volume


def _write(root: Path, path: str, data: bytes = b"x", **kwargs: Any) -> VolumeEntry:
    return vf.write(root, path, [data], **kwargs)


def test_paths_are_names_from_the_root_and_dotdot_is_refused() -> None:
    assert vf.normalized("/a//b/./c/") == ("a", "b", "c")
    assert vf.normalized("") == vf.normalized("/") == ()
    for bad in ("../x", "a/../../b", "a/..", "x\0y", "a" * 5000):
        with pytest.raises(InvalidRequest):
            vf.normalized(bad)


def test_a_write_makes_parents_owned_by_the_user_and_replaces_the_file(root: Path) -> None:
    entry = _write(root, "a/b/c.txt", b"one")
    assert (entry.path, entry.size, entry.type) == ("/a/b/c.txt", 3, "file")
    for made in (root / "a", root / "a/b", root / "a/b/c.txt"):
        assert (made.stat().st_uid, made.stat().st_gid) == (1000, 1000)
    assert stat.S_IMODE((root / "a/b/c.txt").stat().st_mode) == 0o644
    _write(root, "a/b/c.txt", b"two, longer")
    assert (root / "a/b/c.txt").read_bytes() == b"two, longer"
    with pytest.raises(NotFound):
        _write(root, "missing/parent", parents=False)


def test_modes_never_keep_setuid_or_setgid_and_ids_are_bounded(root: Path) -> None:
    assert _write(root, "s", mode=0o6755).mode == 0o755
    assert vf.update(root, "s", mode=0o4777).mode == 0o777
    assert vf.update(root, "s", mode=0o1777).mode == 0o1777  # sticky is harmless
    with pytest.raises(InvalidRequest):
        vf.update(root, "s", uid=70000)
    owned = vf.update(root, "s", uid=0, gid=5)
    assert (owned.uid, owned.gid) == (0, 5)


def test_symlinks_are_listed_never_followed(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host")
    os.symlink(outside, root / "out")
    os.symlink(outside / "secret", root / "pw")
    for call in (
        lambda: vf.open_for_reading(root, "pw"),
        lambda: vf.open_for_reading(root, "out/secret"),
        lambda: _write(root, "out/new"),
        lambda: _write(root, "pw"),
        lambda: vf.entries(root, "out"),
        lambda: vf.make_dir(root, "out/d"),
        lambda: vf.update(root, "pw", mode=0o777),
        lambda: vf.remove(root, "out/secret"),
    ):
        with pytest.raises(InvalidRequest):
            call()
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert stat.S_IMODE((outside / "secret").stat().st_mode) != 0o777
    link = vf.entry(root, "pw")
    assert (link.type, link.target) == ("symlink", str(outside / "secret"))
    vf.remove(root, "out")  # the link itself
    assert not (root / "out").exists() and (outside / "secret").exists()


def test_only_regular_files_are_read_or_written(root: Path) -> None:
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    for call in (
        lambda: vf.open_for_reading(root, "fifo"),  # never blocks: opened non-blocking first
        lambda: vf.open_for_reading(root, "dir"),
        lambda: vf.open_for_reading(root, "/"),
        lambda: _write(root, "fifo"),
        lambda: _write(root, "dir"),
    ):
        with pytest.raises(InvalidRequest):
            call()
    assert vf.entry(root, "fifo").type == "unknown"


def test_directories_are_made_listed_and_removed(root: Path) -> None:
    assert vf.make_dir(root, "d/e", parents=True).type == "directory"
    with pytest.raises(Conflict):
        vf.make_dir(root, "d/e")
    with pytest.raises(NotFound):
        vf.make_dir(root, "x/y")
    _write(root, "d/e/f.txt")
    assert [e.path for e in vf.entries(root, "/", depth=3)] == ["/d", "/d/e", "/d/e/f.txt"]
    assert [e.path for e in vf.entries(root, "/")] == ["/d"]
    with pytest.raises(InvalidRequest):
        vf.entries(root, "/", depth=17)
    with pytest.raises(InvalidRequest):
        vf.entries(root, "d/e/f.txt")
    vf.remove(root, "d")
    assert not (root / "d").exists()
    for missing in ("d", "nothing/at/all"):
        with pytest.raises(NotFound):
            vf.entry(root, missing)
    with pytest.raises(InvalidRequest):
        vf.remove(root, "/")


def test_the_archive_holds_files_dirs_and_links_and_nothing_else(root: Path) -> None:
    big = os.urandom(3 << 20)
    _write(root, "t/a.txt", b"a")
    _write(root, "t/deep/b.bin", big, mode=0o4755)
    os.symlink("/etc/passwd", root / "t/pw")
    os.mkfifo(root / "t/fifo")
    chunks = list(vf.archive(root, "t"))
    assert max(len(c) for c in chunks) <= 1 << 20, "one chunk at a time"
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert sorted(members) == ["a.txt", "deep", "deep/b.bin", "pw"]
        assert members["pw"].issym() and members["pw"].linkname == "/etc/passwd"
        assert members["deep/b.bin"].mode == 0o755 and members["deep/b.bin"].uid == 1000
        extracted = archive.extractfile("deep/b.bin")
        assert extracted is not None and extracted.read() == big
    for bad in ("t/a.txt", "t/pw", "missing"):
        with pytest.raises(RingfenceError):
            next(vf.archive(root, bad))


def test_a_huge_directory_is_refused_holding_only_the_listings_bound(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack (review 2b, I3): a directory of as many long names as the volume has
    inodes. Its listing is refused at the bound, and only about the bound's names were
    ever held (they were all read and sorted first: 46 MiB for 100,000 names)."""
    monkeypatch.setattr(vf, "_MAX_ENTRIES", 20)
    huge = root / "huge"
    huge.mkdir()
    for n in range(4000):
        (huge / f"{n:06d}{'x' * 240}").touch()
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest, match="more than 20 entries"):
            vf.entries(root, "huge")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 300_000, peak  # the 4000 names alone are ~1.2 MB
    listed = vf.entries(root, "/")  # a small listing is whole and sorted
    assert [entry.path for entry in listed] == ["/huge"]
