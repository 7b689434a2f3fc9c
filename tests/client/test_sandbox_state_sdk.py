"""The SDK's sandbox state against a real server: ``checkpoint``/``rollback``, ``pause``/
``resume``, ``connect`` resuming, ``fork``, snapshots; async and blocking."""

from __future__ import annotations

import pytest

from ringfence.client import AsyncRingfence, AsyncSandbox, Ringfence, Sandbox
from ringfence.errors import CheckpointNotFound
from ringfence.models import SandboxState
from tests.client.conftest import LiveServer


@pytest.mark.every_store
async def test_checkpoint_rollback_pause_connect_fork_and_snapshots(live: LiveServer) -> None:
    async with await AsyncSandbox.create(url=live.url, api_key=live.key, timeout=300) as sbx:
        await sbx.files.write("/home/user/f", "one")
        checkpoint = await sbx.checkpoint()
        await sbx.files.write("/home/user/f", "two")
        await sbx.files.write("/home/user/new", "made after")
        assert [c.id for c in await sbx.checkpoints()] == [checkpoint.id]
        await sbx.rollback(checkpoint.id)
        assert await sbx.files.read("/home/user/f") == "one"
        assert not await sbx.files.exists("/home/user/new")
        with pytest.raises(CheckpointNotFound):  # no such checkpoint of it
            await sbx.rollback("ck0")
        with pytest.raises(CheckpointNotFound):
            await sbx.delete_checkpoint("ck0")
        await sbx.delete_checkpoint(checkpoint.id)

        paused = await sbx.pause()
        assert paused.memory is False and paused.sandbox.state is SandboxState.PAUSED
        async with AsyncRingfence(live.url, live.key) as rf:
            again = await rf.sandboxes.connect(sbx.id)  # resumes it
            assert (await again.info()).state is SandboxState.RUNNING
            assert await again.files.read("/home/user/f") == "one"
            await again.aclose()

            children = await sbx.fork(2)
            try:
                assert len({child.id for child in children} | {sbx.id}) == 3
                for child in children:
                    assert await child.files.read("/home/user/f") == "one"
            finally:
                for child in children:
                    await child.kill()
                    await child.aclose()

            snapshot = await sbx.snapshot()
            assert snapshot.id in [s.id for s in await rf.sandboxes.list_snapshots()]
            async with await AsyncSandbox.create(
                url=live.url, api_key=live.key, snapshot=snapshot.id
            ) as started:
                assert await started.files.read("/home/user/f") == "one"
            assert (await rf.sandboxes.get_snapshot(snapshot.id)).sandbox_id == sbx.id
            await rf.sandboxes.delete_snapshot(snapshot.id)
            with pytest.raises(CheckpointNotFound):
                await rf.sandboxes.get_snapshot(snapshot.id)


def test_the_blocking_sdk_pauses_and_resumes(live: LiveServer) -> None:
    with Sandbox.create(url=live.url, api_key=live.key, timeout=120) as sbx:
        sbx.files.write("/home/user/kept", "yes")
        assert sbx.pause(memory=True).memory is True
        assert sbx.info().state is SandboxState.PAUSED
        assert sbx.resume().state is SandboxState.RUNNING
        sbx.pause()
        with Ringfence(live.url, live.key) as rf:
            connected = rf.sandboxes.connect(sbx.id)
            assert connected.files.read("/home/user/kept") == "yes"
            connected.close()
        (child,) = sbx.fork()
        with child:
            assert child.files.read("/home/user/kept") == "yes"
