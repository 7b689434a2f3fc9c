"""``VolumeService`` where the server keeps no volumes (not root, or the job backend): every
call is refused saying why, and a sandbox naming a volume is a 400, never started without it.
And on plain directories: uploads never hold a worker thread while the client is slow, and an
upload that stalls or is cut off leaves the old file as it was."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from ringfence.config import Config
from ringfence.errors import (
    InvalidRequest,
    SandboxError,
    StateUnsupported,
    VolumeFull,
    VolumeNotFound,
)
from ringfence.models import VolumeMount, VolumeSpec
from ringfence.service.volumes import VolumeService
from ringfence.store import MemoryStore

WHY = "sandbox Pods cannot mount volumes yet"


@pytest.fixture
def service() -> VolumeService:
    return VolumeService(MemoryStore(), None, Config(), missing=WHY)


async def test_every_call_is_refused_naming_why(service: VolumeService) -> None:
    assert not service.available
    calls = [
        service.create("acme", VolumeSpec(name="data")),
        service.get("acme", "data"),
        service.delete("acme", "data"),
        service.stat("acme", "data", "/"),
    ]
    for call in calls:
        with pytest.raises(StateUnsupported, match=WHY):
            await call
    await service.unmount_all()  # nothing to do, nothing raised


async def test_a_sandbox_naming_a_volume_is_a_400_naming_why(service: VolumeService) -> None:
    with pytest.raises(InvalidRequest, match=WHY):
        async with service.bound("acme", [VolumeMount(name="data", path="/mnt/data")]):
            raise AssertionError("bound without a volume")
    async with service.bound("acme", []) as bound:  # none asked: nothing refused
        assert bound == ()


class _DirectoryDisks:
    """Volumes as plain directories (no mount needed): what the file calls' thread use is
    about, not the filesystem."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def create(self, volume_id: str, quota: int) -> None:
        (self.root / volume_id).mkdir()

    def mount(self, volume_id: str) -> Path:
        if not (self.root / volume_id).is_dir():  # as VolumeDisks says it
            raise SandboxError(f"volume {volume_id} has no filesystem on this server")
        return self.root / volume_id

    def usage(self, volume_id: str) -> int:
        return 0

    def room(self) -> tuple[int, int]:
        return 1 << 50, 0  # the disk is never the limit here

    def delete(self, volume_id: str) -> None:
        shutil.rmtree(self.root / volume_id, ignore_errors=True)


@pytest.fixture
def on_disk(tmp_path: Path) -> VolumeService:
    disks: Any = _DirectoryDisks(tmp_path)
    return VolumeService(MemoryStore(), disks, Config(), body_idle_seconds=1.0)


async def _stalled(first: bytes, release: asyncio.Event) -> AsyncIterator[bytes]:
    """An upload's body that sends ``first`` and then nothing until ``release``."""
    yield first
    await release.wait()


async def test_slow_uploads_never_hold_the_servers_threads(on_disk: VolumeService) -> None:
    """The attack (review 2b, I1): more uploads than the loop has worker threads, each
    sending one byte and then nothing. Other calls (any tenant's) still get their threads."""
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=2)
    loop.set_default_executor(pool)
    await on_disk.create("acme", VolumeSpec(name="data"))
    release = asyncio.Event()
    uploads = [
        asyncio.create_task(on_disk.write("acme", "data", f"f{n}", _stalled(b"x", release)))
        for n in range(6)
    ]
    try:
        await asyncio.sleep(0)  # let them start (the claim holds for any interleaving)
        entry = await asyncio.wait_for(on_disk.stat("acme", "data", "/"), 3)
        assert entry.type == "directory"
        assert (await asyncio.wait_for(on_disk.get("acme", "data"), 3)).name == "data"
    finally:
        release.set()
        await asyncio.wait(uploads, timeout=5)
    assert all(task.done() for task in uploads)


async def test_an_idle_upload_is_dropped_and_the_old_file_is_kept(
    on_disk: VolumeService, tmp_path: Path
) -> None:
    volume = await on_disk.create("acme", VolumeSpec(name="data"))
    await on_disk.write("acme", "data", "keep.txt", _body(b"old contents"))
    release = asyncio.Event()
    with pytest.raises(InvalidRequest, match="sent nothing for 1 s"):
        await asyncio.wait_for(
            on_disk.write("acme", "data", "keep.txt", _stalled(b"new", release)), 5
        )
    assert (tmp_path / volume.id / "keep.txt").read_bytes() == b"old contents"
    assert sorted(os.listdir(tmp_path / volume.id)) == ["keep.txt"]  # no upload left


async def test_a_client_gone_mid_upload_leaves_the_old_file_whole(
    on_disk: VolumeService, tmp_path: Path
) -> None:
    volume = await on_disk.create("acme", VolumeSpec(name="data"))
    await on_disk.write("acme", "data", "keep.txt", _body(b"old contents"))

    async def cut_off() -> AsyncIterator[bytes]:
        yield b"new, but only the start"
        raise ClientDisconnect()

    with pytest.raises(ClientDisconnect):
        await on_disk.write("acme", "data", "keep.txt", cut_off())
    assert (tmp_path / volume.id / "keep.txt").read_bytes() == b"old contents"
    assert sorted(os.listdir(tmp_path / volume.id)) == ["keep.txt"]
    with pytest.raises(ClientDisconnect):  # a new file cut off is not left either
        await on_disk.write("acme", "data", "new.txt", cut_off())
    assert sorted(os.listdir(tmp_path / volume.id)) == ["keep.txt"]


async def _body(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def test_a_tenants_quotas_add_up_to_its_budget_at_most(tmp_path: Path) -> None:
    """The review's I2, per tenant: 100 volumes of 16 GiB each were allowed to one tenant."""
    disks: Any = _DirectoryDisks(tmp_path)
    config = Config(volume_tenant_bytes=3 << 30, volume_max_bytes=2 << 30)
    service = VolumeService(MemoryStore(), disks, config)
    await service.create("acme", VolumeSpec(name="one", quota_bytes=2 << 30))
    with pytest.raises(VolumeFull, match=r"add up to 4.00 GiB .* most per tenant is 3.00 GiB"):
        await service.create("acme", VolumeSpec(name="two", quota_bytes=2 << 30))
    await service.create("acme", VolumeSpec(name="two", quota_bytes=1 << 30))  # fits exactly
    await service.create("zenith", VolumeSpec(name="one", quota_bytes=2 << 30))  # its own


async def test_a_volume_deleted_under_a_file_call_is_volume_not_found(
    on_disk: VolumeService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 2b, M6: a file call found the volume, a delete removed it before the call
    mounted it: the call was a 500 ("has no filesystem on this server")."""
    find = on_disk._find

    async def found_then_deleted(tenant: str, ref: str) -> Any:
        volume = await find(tenant, ref)
        monkeypatch.setattr(on_disk, "_find", find)
        await on_disk.delete(tenant, ref)
        return volume

    for call in (
        lambda: on_disk.stat("acme", "data", "/"),
        lambda: on_disk.list_dir("acme", "data", "/"),
        lambda: on_disk.write("acme", "data", "f", _body(b"x")),
        lambda: on_disk.read("acme", "data", "f"),
        lambda: on_disk.remove("acme", "data", "f"),
    ):
        await on_disk.create("acme", VolumeSpec(name="data"))
        monkeypatch.setattr(on_disk, "_find", found_then_deleted)
        with pytest.raises(VolumeNotFound, match="deleted meanwhile"):
            await call()
