"""``rf.volumes`` (the SDK, blocking and async) and ``ringfence volume`` as a user runs them,
against a live server with real sandboxes; ``sandbox create --volume``."""

from __future__ import annotations

import json
import tarfile
import uuid
from pathlib import Path

import pytest

from ringfence.client import AsyncRingfence, Ringfence, Sandbox
from ringfence.errors import VolumeExists, VolumeInUse, VolumeNotFound
from tests.client.conftest import LiveServer
from tests.client.test_sandbox_cli import _cli


def _name() -> str:
    return f"v-{uuid.uuid4().hex[:8]}"


def test_the_sdk_creates_fills_mounts_and_deletes_a_volume(live: LiveServer) -> None:
    name = _name()
    with Ringfence(live.url, live.key) as rf:
        made = rf.volumes.create(name, quota_bytes=32 << 20)
        with pytest.raises(VolumeExists):
            rf.volumes.create(name)
        assert rf.volumes.write_file(name, "in/a.txt", "hello").path == "/in/a.txt"
        assert rf.volumes.read_file(made.id, "/in/a.txt") == b"hello"
        assert [e.name for e in rf.volumes.list_dir(name, "/in")] == ["a.txt"]
        sbx = Sandbox.create(volumes=[{"name": name, "path": "/mnt/v"}], url=live.url,
                             api_key=live.key)  # fmt: skip
        try:
            assert sbx.files.read("/mnt/v/in/a.txt") == "hello"
            sbx.commands.run("echo back > /mnt/v/back.txt")
            with pytest.raises(VolumeInUse):
                rf.volumes.delete(name)
        finally:
            sbx.kill()
            sbx.close()
        assert rf.volumes.read_file(name, "back.txt") == b"back\n"
        assert rf.volumes.get(name).used_bytes
        rf.volumes.delete(name)
        with pytest.raises(VolumeNotFound):
            rf.volumes.get(name)


async def test_the_async_sdk_is_the_same(live: LiveServer) -> None:
    name = _name()
    async with AsyncRingfence(live.url, live.key) as rf:
        made = await rf.volumes.create(name)
        assert made.id in [v.id for v in await rf.volumes.list()]
        await rf.volumes.make_dir(name, "/a/b", parents=True)
        await rf.volumes.remove(name, "/a")
        await rf.volumes.delete(made.id)


def test_volume_commands(live: LiveServer, tmp_path: Path) -> None:
    name = _name()
    created = _cli(live, "volume", "create", name, "--quota", "16M")
    assert created.returncode == 0, created.stderr
    volume_id = created.stdout.decode().strip()
    try:
        assert _cli(live, "volume", "put", name, "/notes.txt", stdin=b"kept").returncode == 0
        assert _cli(live, "volume", "get", name, "notes.txt").stdout == b"kept"
        listed = json.loads(_cli(live, "volume", "list", "--json").stdout)
        assert volume_id in [v["id"] for v in listed]
        info = json.loads(_cli(live, "volume", "info", name, "--json").stdout)
        assert info["quota_bytes"] == 16 << 20 and info["used_bytes"] > 0
        assert "/notes.txt" in _cli(live, "volume", "ls", name).stdout.decode()
        archive = tmp_path / "v.tar"
        saved = _cli(live, "volume", "tar", name, "/", "-o", str(archive))
        assert saved.returncode == 0, saved.stderr
        with tarfile.open(archive) as opened:
            assert opened.getnames() == ["lost+found", "notes.txt"]
        sandbox = _cli(live, "sandbox", "create", "--volume", f"{name}:/mnt/ro:ro")
        assert sandbox.returncode == 0, sandbox.stderr
        sid = sandbox.stdout.decode().strip()
        try:
            assert _cli(live, "files", "read", sid, "/mnt/ro/notes.txt").stdout == b"kept"
            refused = _cli(live, "files", "write", sid, "/mnt/ro/new", stdin=b"x")
            assert refused.returncode != 0
            busy = _cli(live, "volume", "rm", name)
            assert busy.returncode == 1 and len(busy.stderr.splitlines()) == 1, busy.stderr
        finally:
            _cli(live, "sandbox", "kill", sid)
        bad = _cli(live, "sandbox", "create", "--volume", "no-path")
        assert bad.returncode == 2, bad.stderr
    finally:
        assert _cli(live, "volume", "rm", name).returncode == 0
    gone = _cli(live, "volume", "info", name)
    assert gone.returncode == 1 and b"no volume" in gone.stderr
