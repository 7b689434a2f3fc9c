"""``VolumeService`` where the server keeps no volumes (not root, or the job backend): every
call is refused saying why, and a sandbox naming a volume is a 400, never started without it."""

from __future__ import annotations

import pytest

from ringfence.config import Config
from ringfence.errors import InvalidRequest, StateUnsupported
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
