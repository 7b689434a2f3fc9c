"""``files.download`` (the SDK, and ``ringfence files read -o``) writes the local file whole
or not at all: a failed download leaves no file behind and a file already there as it was."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringfence.client import AsyncSandbox, FileNotFound
from ringfence.errors import InvalidRequest
from tests.client.conftest import LiveServer
from tests.client.test_sandbox_cli import _cli


@pytest.fixture
async def sbx(live: LiveServer) -> AsyncIterator[AsyncSandbox]:
    async with await AsyncSandbox.create(url=live.url, api_key=live.key) as sandbox:
        yield sandbox


async def test_a_failed_download_leaves_nothing(sbx: AsyncSandbox, tmp_path: Path) -> None:
    with pytest.raises(FileNotFound):
        await sbx.files.download("missing.txt", tmp_path / "out.txt")
    with pytest.raises(InvalidRequest):
        await sbx.files.download("/tmp", tmp_path / "dir.txt")  # a directory
    assert list(tmp_path.iterdir()) == []


async def test_a_failed_download_keeps_the_local_file(sbx: AsyncSandbox, tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("mine")
    with pytest.raises(FileNotFound):
        await sbx.files.download("missing.txt", kept)
    assert kept.read_text() == "mine" and list(tmp_path.iterdir()) == [kept]
    await sbx.files.write("there.txt", "theirs")
    assert await sbx.files.download("there.txt", kept) == kept
    assert kept.read_text() == "theirs" and list(tmp_path.iterdir()) == [kept]


def test_the_cli_leaves_nothing_on_a_failed_read(live: LiveServer, tmp_path: Path) -> None:
    created = _cli(live, "sandbox", "create")
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.decode().strip()
    try:
        fresh = tmp_path / "fresh.txt"
        failed = _cli(live, "files", "read", sandbox_id, "missing.txt", "-o", str(fresh))
        assert failed.returncode == 1 and b"Traceback" not in failed.stderr
        kept = tmp_path / "kept.txt"
        kept.write_text("mine")
        failed = _cli(live, "files", "read", sandbox_id, "missing.txt", "-o", str(kept))
        assert failed.returncode == 1
        assert kept.read_text() == "mine" and list(tmp_path.iterdir()) == [kept]
    finally:
        _cli(live, "sandbox", "kill", sandbox_id)
