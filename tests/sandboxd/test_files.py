"""The filesystem service and /files against a real daemon."""

from __future__ import annotations

import gzip
import os
import socket
from collections.abc import Iterator

from .conftest import Daemon, wait_for

FS = "filesystem.Filesystem"


def call(daemon: Daemon, method: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    response = daemon.unary(f"{FS}/{method}", body)
    return response.status_code, response.json()


def test_make_dir_stat_list_move_remove(daemon: Daemon) -> None:
    status, made = call(daemon, "MakeDir", {"path": "fs/a/b"})
    assert status == 200
    assert made["entry"]["type"] == "FILE_TYPE_DIRECTORY"  # type: ignore[index]
    status, again = call(daemon, "MakeDir", {"path": "fs/a/b"})
    assert (status, again["code"]) == (409, "already_exists")
    root = daemon.home / "fs"
    (root / "a" / "file.txt").write_bytes(b"hello")
    (root / "link").symlink_to(root / "a" / "file.txt")
    (root / "dangling").symlink_to(root / "nope")

    status, st = call(daemon, "Stat", {"path": str(root / "a" / "file.txt")})
    entry = st["entry"]
    assert entry["type"] == "FILE_TYPE_FILE" and entry["size"] == "5"  # type: ignore[index]
    assert entry["permissions"].startswith("-rw")  # type: ignore[index]
    assert entry["modifiedTime"].endswith("Z")  # type: ignore[index]

    _, link = call(daemon, "Stat", {"path": "fs/link"})
    assert link["entry"]["isSymlink"] is True  # type: ignore[index]
    assert link["entry"]["type"] == "FILE_TYPE_FILE"  # type: ignore[index]
    assert link["entry"]["symlinkTarget"] == str(root / "a" / "file.txt")  # type: ignore[index]

    _, shallow = call(daemon, "ListDir", {"path": "fs"})
    names = {e["name"] for e in shallow["entries"]}  # type: ignore[attr-defined]
    assert names == {"a", "link", "dangling"}
    _, deep = call(daemon, "ListDir", {"path": "fs", "depth": "3"})
    paths = [e["path"] for e in deep["entries"]]  # type: ignore[attr-defined]
    # envd's order (filepath.WalkDir): by name, each directory's contents right after it
    assert paths == [str(root / p) for p in ("a", "a/b", "a/file.txt", "dangling", "link")]

    status, moved = call(daemon, "Move", {"source": "fs/a/file.txt", "destination": "fs/c/d.txt"})
    assert status == 200 and moved["entry"]["path"] == str(root / "c" / "d.txt")  # type: ignore[index]

    assert call(daemon, "Remove", {"path": "fs/dangling"})[0] == 200
    assert call(daemon, "Remove", {"path": "fs"})[0] == 200
    assert not root.exists()
    assert call(daemon, "Remove", {"path": "fs"}) == (200, {}), "nothing there: done (envd's)"
    for method, body in (
        ("Stat", {"path": "fs"}),
        ("ListDir", {"path": "fs"}),
        ("Move", {"source": "fs", "destination": "x"}),
    ):
        status, err = call(daemon, method, body)
        assert (status, err["code"]) == (404, "not_found"), method


def test_list_dir_of_a_file_is_invalid_argument(daemon: Daemon) -> None:
    (daemon.home / "plain").write_text("x")
    status, err = call(daemon, "ListDir", {"path": "plain"})
    assert (status, err["code"]) == (400, "invalid_argument")


def test_binary_round_trip(daemon: Daemon) -> None:
    data = bytes(range(256)) * 1000
    response = daemon.client.post(
        "/files",
        params={"path": "bin/data.bin"},
        content=data,
        headers={"content-type": "application/octet-stream"},
    )
    assert response.status_code == 200
    assert response.json() == [
        {"name": "data.bin", "type": "file", "path": str(daemon.home / "bin" / "data.bin")}
    ]
    downloaded = daemon.client.get("/files", params={"path": "bin/data.bin"})
    assert downloaded.status_code == 200 and downloaded.content == data
    missing = daemon.client.get("/files", params={"path": "bin/nope"})
    assert missing.status_code == 404 and missing.json()["code"] == 404
    assert daemon.client.get("/files", params={"path": "bin"}).status_code == 400


def test_gzip_upload(daemon: Daemon) -> None:
    response = daemon.client.put(
        "/files",
        params={"path": "z.txt"},
        content=gzip.compress(b"unzipped " * 1000),
        headers={"content-type": "application/octet-stream", "content-encoding": "gzip"},
    )
    assert response.status_code == 200
    assert (daemon.home / "z.txt").read_bytes() == b"unzipped " * 1000


def test_multipart_is_refused(daemon: Daemon) -> None:
    response = daemon.client.post("/files", params={"path": "m"}, files={"file": ("m", b"x")})
    assert response.status_code == 415


def test_an_upload_writes_in_place_as_envd_does(daemon: Daemon) -> None:
    """No temporary file beside the target (a watcher would see its events, not the
    file's): an aborted upload leaves what had arrived, as envd's does; the daemon serves on."""
    target = daemon.home / "keep.txt"
    target.write_bytes(b"old")
    target.chmod(0o600)
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(daemon.path)
    sock.sendall(
        b"POST /files?path=keep.txt HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n" + b"n" * 1000
    )
    wait_for(lambda: target.read_bytes() == b"n" * 1000)
    assert [p.name for p in daemon.home.iterdir() if p.name.startswith(".keep")] == []
    sock.close()
    bad_gzip = daemon.client.post(
        "/files",
        params={"path": "keep.txt"},
        content=b"not gzip at all",
        headers={"content-encoding": "gzip"},
    )
    assert bad_gzip.status_code == 400
    assert daemon.client.get("/health").status_code == 204
    assert target.stat().st_mode & 0o777 == 0o600, "the file's own mode is kept"


def test_an_upload_committed_at_end_keeps_the_previous_content_until_whole(
    daemon: Daemon,
) -> None:
    target = daemon.home / "kept.txt"
    target.write_bytes(b"old")
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(daemon.path)
    sock.sendall(
        b"POST /files?path=kept.txt HTTP/1.1\r\nHost: x\r\nRingfence-Commit: at-end\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n" + b"n" * 1000
    )
    sock.close()
    assert daemon.client.get("/health").status_code == 204
    wait_for(lambda: not [p for p in daemon.home.iterdir() if p.name.startswith(".kept")])
    assert target.read_bytes() == b"old"
    whole = daemon.client.post(
        "/files",
        params={"path": "kept.txt"},
        content=b"new",
        headers={"ringfence-commit": "at-end"},
    )
    assert whole.status_code == 200 and target.read_bytes() == b"new"


def test_an_upload_onto_a_fifo_is_refused_not_hung(daemon: Daemon) -> None:
    os.mkfifo(daemon.home / "pipe")
    answer = daemon.client.post("/files", params={"path": "pipe"}, content=b"x")
    assert answer.status_code >= 400
    assert daemon.client.get("/health").status_code == 204


def test_100_mb_upload_and_download_stay_streamed(daemon: Daemon) -> None:
    block = os.urandom(1 << 20)

    def body() -> Iterator[bytes]:
        for _ in range(100):
            yield block

    response = daemon.client.post(
        "/files",
        params={"path": "big.bin"},
        content=body(),
        headers={"content-type": "application/octet-stream"},
    )
    assert response.status_code == 200
    assert (daemon.home / "big.bin").stat().st_size == 100 << 20
    size = 0
    with daemon.client.stream("GET", "/files", params={"path": "big.bin"}) as download:
        for chunk in download.iter_bytes():
            size += len(chunk)
    assert size == 100 << 20
    assert daemon.status("VmHWM") < 40 * 1024  # kB: far below the 100 MB that went through
    (daemon.home / "big.bin").unlink()


def test_upload_metadata_is_checked_then_kept_as_xattrs(daemon: Daemon) -> None:
    bad = daemon.client.post(
        "/files", params={"path": "md.txt"}, content=b"x", headers={"x-metadata-a": "\x7f"}
    )
    assert bad.status_code == 400 and not (daemon.home / "md.txt").exists()
    many = {f"x-metadata-k{i}": "v" for i in range(65)}
    assert daemon.client.post("/files", params={"path": "md.txt"}, content=b"x",
                              headers=many).status_code == 400  # fmt: skip
    ok = daemon.client.post(
        "/files", params={"path": "md.txt"}, content=b"x", headers={"x-metadata-who": "me"}
    )
    assert ok.json() == [{"name": "md.txt", "type": "file", "path": str(daemon.home / "md.txt"),
                          "metadata": {"who": "me"}}]  # fmt: skip
    assert os.getxattr(daemon.home / "md.txt", "user.e2b.who") == b"me"
    _, stat = call(daemon, "Stat", {"path": "md.txt"})
    assert stat["entry"]["metadata"] == {"who": "me"}  # type: ignore[index]
