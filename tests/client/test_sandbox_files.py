"""``sbx.files`` against a real server: contents both ways, listings, changes, watches."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringfence.client import (
    AsyncSandbox,
    EventType,
    FileNotFound,
    FilesystemEvent,
    FileType,
)
from ringfence.errors import InvalidRequest
from tests.client.conftest import LiveServer

WAIT = 30


@pytest.fixture
async def sbx(live: LiveServer) -> AsyncIterator[AsyncSandbox]:
    async with await AsyncSandbox.create(url=live.url, api_key=live.key) as sandbox:
        yield sandbox


async def test_text_and_binary_round_trip(sbx: AsyncSandbox) -> None:
    info = await sbx.files.write("notes/a.txt", "héllo\n")
    assert (info.name, info.path) == ("a.txt", "/home/user/notes/a.txt")
    assert await sbx.files.read("notes/a.txt") == "héllo\n"
    blob = bytes(range(256)) * 1000
    await sbx.files.write("/tmp/blob", blob)
    assert await sbx.files.read("/tmp/blob", format="bytes") == blob
    assert b"".join([c async for c in sbx.files.read_stream("/tmp/blob")]) == blob
    assert (await sbx.commands.run("sha256sum < /tmp/blob")).stdout.split()[0] == (
        __import__("hashlib").sha256(blob).hexdigest()
    )


async def test_write_streams_files_and_iterators(sbx: AsyncSandbox) -> None:
    await sbx.files.write("from-file", io.BytesIO(b"binary file"))
    await sbx.files.write("from-text-file", io.StringIO("text file"))
    await sbx.files.write("from-iter", iter([b"a", b"b", b"c"]))

    async def parts() -> AsyncIterator[bytes]:
        for part in (b"x", b"y"):
            yield part

    await sbx.files.write("from-aiter", parts())
    assert [await sbx.files.read(p) for p in ("from-file", "from-text-file", "from-iter")] == [
        "binary file", "text file", "abc",
    ]  # fmt: skip
    assert await sbx.files.read("from-aiter") == "xy"


async def test_missing_files_and_directories(sbx: AsyncSandbox) -> None:
    with pytest.raises(FileNotFound) as exc:
        await sbx.files.read("nope.txt")
    assert exc.value.code == "not_found"
    with pytest.raises(FileNotFound):
        await sbx.files.get_info("nope.txt")
    with pytest.raises(FileNotFound):
        await sbx.files.list("no-dir")
    await sbx.files.remove("nope.txt")  # nothing to remove: done, as E2B's envd
    with pytest.raises(InvalidRequest):
        await sbx.files.read("/tmp")  # a directory


async def test_list_exists_make_dir_rename_remove(sbx: AsyncSandbox) -> None:
    assert await sbx.files.make_dir("tree/sub") is True
    assert await sbx.files.make_dir("tree/sub") is False
    await sbx.files.write("tree/top.txt", "12345")
    await sbx.files.write("tree/sub/deep.txt", "x")
    shallow = await sbx.files.list("tree")
    assert [(e.name, e.type) for e in shallow] == [
        ("sub", FileType.DIRECTORY), ("top.txt", FileType.FILE),
    ]  # fmt: skip
    deep = await sbx.files.list("tree", depth=2)
    assert sorted(e.path for e in deep) == [
        "/home/user/tree/sub", "/home/user/tree/sub/deep.txt", "/home/user/tree/top.txt",
    ]  # fmt: skip
    info = await sbx.files.get_info("tree/top.txt")
    assert (info.size, info.owner, info.modified_time.tzinfo is not None) == (5, "user", True)
    with pytest.raises(InvalidRequest):
        await sbx.files.make_dir("tree/top.txt")  # a file is in the way
    moved = await sbx.files.rename("tree/top.txt", "tree/moved.txt")
    assert moved.path == "/home/user/tree/moved.txt"
    assert not await sbx.files.exists("tree/top.txt") and await sbx.files.exists("tree/moved.txt")
    await sbx.files.remove("tree")
    assert not await sbx.files.exists("tree")


async def test_watch_dir_reports_changes(sbx: AsyncSandbox) -> None:
    await sbx.files.make_dir("watched")
    handle = await sbx.files.watch_dir("watched")
    try:
        await sbx.files.make_dir("watched/new-dir")

        async def first_create() -> FilesystemEvent:
            async for event in handle:
                if event.name == "new-dir":
                    return event
            raise AssertionError("the watch ended")

        event = await asyncio.wait_for(first_create(), WAIT)
        assert event.type is EventType.CREATE
    finally:
        await handle.stop()
    assert [e async for e in handle] == []  # stopped: iteration ends
    with pytest.raises(FileNotFound):
        await sbx.files.watch_dir("not-there")


_STREAM_SCRIPT = """
import hashlib, json, resource, sys
from ringfence.client import Sandbox
url, key, source, target = sys.argv[1:]
def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with Sandbox.create(url=url, api_key=key, limits={"disk": "160M", "memory": "512M"}) as sbx:
    sbx.files.write("warm-up", b"x")
    list(sbx.files.read_stream("warm-up"))
    before = peak()
    sbx.files.upload(source, "big.bin")
    remote = sbx.commands.run("sha256sum big.bin").stdout.split()[0]
    sbx.files.download("big.bin", target)
    print(json.dumps({"before": before, "after": peak(), "remote": remote}))
"""


def test_100_mb_streams_through_without_growing_the_client(
    live: LiveServer, tmp_path: Path
) -> None:
    import hashlib

    source, target = tmp_path / "source.bin", tmp_path / "target.bin"
    digest = hashlib.sha256()
    with source.open("wb") as out:
        block = os.urandom(1 << 20)
        for i in range(100):
            chunk = bytes([i]) + block[1:]
            digest.update(chunk)
            out.write(chunk)
    # A fresh process: its peak RSS before the transfer is the SDK's, not the test suite's.
    done = subprocess.run(
        [sys.executable, "-c", _STREAM_SCRIPT, live.url, live.key, str(source), str(target)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["remote"] == digest.hexdigest()
    assert target.stat().st_size == 100 << 20
    with target.open("rb") as got:
        check = hashlib.sha256()
        while chunk := got.read(1 << 20):
            check.update(chunk)
    assert check.hexdigest() == digest.hexdigest()
    grown = report["after"] - report["before"]
    assert grown < 30 << 20, f"the client's peak memory grew by {grown >> 20} MB"
