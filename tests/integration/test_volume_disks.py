"""``backends.local.disks`` on this host (root, loop devices): the quota is the filesystem's
size, at most ``max_mounted`` host mounts stay, and a filesystem something still holds is
mounted again as it is (one superblock), never beside itself."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringfence.backends.local.disks import VolumeDisks
from ringfence.config import Config
from ringfence.errors import HTTP_STATUS, SandboxError, VolumeFull
from ringfence.models import VolumeSpec
from ringfence.service.volumes import VolumeService
from ringfence.store import MemoryStore

pytestmark = pytest.mark.integration
MiB = 1 << 20


@pytest.fixture
def disks(tmp_path: Path) -> Iterator[VolumeDisks]:
    if os.geteuid() != 0:
        pytest.skip("volumes need root (the server mounts them)")
    opened = VolumeDisks.open(tmp_path)
    yield opened
    opened.close()


def _mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in open("/proc/self/mountinfo"))


def test_a_volume_holds_its_quota_and_no_more(disks: VolumeDisks) -> None:
    disks.create("vo" + "1" * 20, 4 * MiB)
    root = disks.mount("vo" + "1" * 20)
    with pytest.raises(OSError) as full, open(root / "fill", "wb") as out:
        for _ in range(8):
            out.write(b"x" * MiB)
            out.flush()
            os.fsync(out.fileno())
    assert full.value.errno == errno.ENOSPC
    assert disks.usage("vo" + "1" * 20) <= 4 * MiB
    with pytest.raises(FileExistsError):
        disks.create("vo" + "1" * 20, 4 * MiB)  # never over an existing volume


def test_the_least_recently_used_is_unmounted_and_comes_back(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("volumes need root (the server mounts them)")
    disks = VolumeDisks(tmp_path / "volumes", max_mounted=2)
    ids = [f"vo{n:020x}" for n in range(3)]
    try:
        for volume_id in ids:
            disks.create(volume_id, 2 * MiB)
        first = disks.mount(ids[0])
        (first / "kept").write_text("kept")
        with open(first / "held", "w") as held:  # a file call under way on the first
            disks.mount(ids[1])
            disks.mount(ids[2])  # evicts the first (the least recently used)
            assert not _mounted(first) and _mounted(disks.mount(ids[2]))
            held.write("written after the unmount")  # its filesystem lives on
            held.flush()
            again = disks.mount(ids[0])  # the same filesystem, through its loop device
            assert (again / "held").read_text() == "written after the unmount"
        disks.close()
        again = disks.mount(ids[0])  # let go meanwhile: mounted afresh
        assert (again / "kept").read_text() == "kept"
        assert (again / "held").read_text() == "written after the unmount"
        assert sum(_mounted(tmp_path / "volumes" / "mnt" / v) for v in ids) == 1
    finally:
        disks.close()
    assert not any(_mounted(tmp_path / "volumes" / "mnt" / v) for v in ids)


def test_a_missing_filesystem_is_an_error_not_an_empty_volume(disks: VolumeDisks) -> None:
    with pytest.raises(SandboxError):
        disks.mount("vo" + "2" * 20)
    with pytest.raises(ValueError):
        disks.mount("../../etc")


async def test_quotas_are_never_promised_past_the_hosts_disk(disks: VolumeDisks) -> None:
    """The attack (review 2b, I2): sparse images of a quota each, created until their sum
    passes the disk's free space. The disk's room is counted: what every volume may still
    take plus the new quota plus the reserve must fit what is free."""
    free, promised = disks.room()
    assert promised == 0
    # A reserve that leaves room for two 16 MiB volumes and not three (mkfs writes ~1 MiB).
    config = Config(volume_reserve_bytes=free - 40 * MiB, volume_max_bytes=64 * MiB)
    service = VolumeService(MemoryStore(), disks, config)
    for name in ("one", "two"):
        await service.create("acme", VolumeSpec(name=name, quota_bytes=16 * MiB))
    with pytest.raises(VolumeFull, match=r"no room for a volume of 0\.02 GiB") as refused:
        await service.create("zenith", VolumeSpec(name="three", quota_bytes=16 * MiB))
    assert "volumes may still take" in refused.value.message
    assert HTTP_STATUS[refused.value.code] == 507
    _, promised = disks.room()
    assert 28 * MiB < promised <= 32 * MiB  # the two quotas less what mkfs wrote
    await service.delete("acme", "one")  # its promise goes with it
    await service.create("zenith", VolumeSpec(name="three", quota_bytes=16 * MiB))
