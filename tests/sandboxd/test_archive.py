"""A directory as a tar stream (``sandboxd.archive``, ``GET /files/archive``): the tree
round-trips, links are stored as links and never followed, nothing outside the directory
is read even when the tree changes under the walk, special files are left out, and the
stream comes in bounded pieces."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from ringfence.sandboxd.archive import CHUNK, Walk, tar_stream
from tests.sandboxd.conftest import Daemon


def _tree(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (root / "src" / "empty").mkdir()
    (root / "data.bin").write_bytes(bytes(range(256)) * 100)
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "ünïcode name").write_text("x")
    os.symlink("src/pkg/mod.py", root / "inside-link")
    os.symlink("/etc", root / "etc-link")  # names something outside: kept as a link only
    os.mkfifo(root / "fifo")


def _archive(root: Path, walk: Walk | None = None) -> tuple[list[bytes], tarfile.TarFile]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pieces = list(tar_stream(fd, walk))
    finally:
        os.close(fd)
    return pieces, tarfile.open(fileobj=io.BytesIO(b"".join(pieces)), mode="r:")


def test_a_tree_round_trips_with_links_as_links_and_no_special_files(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _tree(root)
    walk = Walk()
    _, tar = _archive(root, walk)
    members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {
        "data.bin", "etc-link", "inside-link", "run.sh", "src", "src/empty", "src/pkg",
        "src/pkg/mod.py", "ünïcode name",
    }  # fmt: skip
    assert members["etc-link"].issym() and members["etc-link"].linkname == "/etc"
    assert members["inside-link"].issym()
    assert members["src/pkg"].isdir() and members["run.sh"].mode == 0o755
    extracted = tar.extractfile("data.bin")
    assert extracted is not None and extracted.read() == bytes(range(256)) * 100
    assert (walk.skipped, walk.unreadable, walk.entries) == (1, 0, 9)
    assert all(not m.name.startswith(("/", "..")) and m.uname == "" for m in members.values())


def test_a_large_file_streams_in_bounded_pieces(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with open(root / "big", "wb") as f:
        f.truncate(40 * CHUNK)  # sparse: cheap to make, 10 MiB to stream
    pieces, tar = _archive(root)
    assert len(pieces) >= 40 and max(len(p) for p in pieces) <= CHUNK + 2 * tarfile.BLOCKSIZE
    assert tar.getmember("big").size == 40 * CHUNK


def test_a_file_that_shrinks_while_read_is_padded_in_bounded_pieces(tmp_path: Path) -> None:
    """The header promised the size taken at open; the padding for what vanished comes in
    pieces of at most CHUNK, never the whole remainder at once (a sparse file of a huge
    apparent size, truncated meanwhile, must not cost its size in memory)."""
    root = tmp_path / "root"
    root.mkdir()
    size = 256 * CHUNK  # 64 MiB apparent, sparse
    with open(root / "shrinks", "wb") as f:
        f.truncate(size)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        stream = tar_stream(fd)
        pieces = [next(stream), next(stream)]  # the header, then the first CHUNK of data
        os.truncate(root / "shrinks", 0)
        largest = max(len(piece) for piece in pieces)
        total = sum(len(piece) for piece in pieces)
        for piece in stream:
            largest = max(largest, len(piece))
            total += len(piece)
    finally:
        os.close(fd)
    assert largest <= CHUNK + 2 * tarfile.BLOCKSIZE  # as any piece (a header may ride along)
    assert total >= size + 2 * tarfile.BLOCKSIZE and total % tarfile.BLOCKSIZE == 0


def test_a_directory_swapped_for_a_link_mid_walk_is_stored_as_the_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    root = tmp_path / "root"
    root.mkdir()
    with open(root / "0-big", "wb") as f:
        f.truncate(4 * CHUNK)  # streamed first (names are sorted): the swap lands meanwhile
    (root / "z-dir").mkdir()
    (root / "z-dir" / "own").write_text("mine")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        stream = tar_stream(fd)
        pieces = [next(stream)]
        os.rename(root / "z-dir", tmp_path / "moved")
        os.symlink(outside, root / "z-dir")
        pieces += list(stream)
    finally:
        os.close(fd)
    data = b"".join(pieces)
    assert b"host secret" not in data
    tar = _tar(data)
    swapped = tar.getmember("z-dir")
    assert swapped.issym() and swapped.linkname == str(outside)
    assert "z-dir/secret" not in tar.getnames()


def test_the_daemon_serves_a_directory_as_a_tar(daemon: Daemon) -> None:
    root = daemon.home / "project"
    root.mkdir()
    _tree(root)
    got = daemon.client.get("/files/archive", params={"path": "project"})
    assert got.status_code == 200, got.text
    assert got.headers["content-type"] == "application/x-tar"
    tar = _tar(got.content)
    assert "src/pkg/mod.py" in tar.getnames() and "fifo" not in tar.getnames()
    missing = daemon.client.get("/files/archive", params={"path": "nope"})
    assert missing.status_code == 404
    a_file = daemon.client.get("/files/archive", params={"path": "project/run.sh"})
    assert a_file.status_code == 400
    assert daemon.client.get("/files/archive").status_code == 400
    os.symlink("/proc", daemon.home / "to-proc")
    for kernel in ("/proc", "/sys/fs", "/dev", "to-proc"):
        refused = daemon.client.get("/files/archive", params={"path": kernel})
        assert refused.status_code == 400 and "kernel" in refused.text, kernel


def _tar(data: bytes) -> tarfile.TarFile:
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:")
