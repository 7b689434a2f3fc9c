"""The Pod runtime's watch of a sandbox, on the Kubernetes API stand-in (``fake_api``): its
end is seen however late the thread of a watch begins (a loaded machine, a slow API)."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.kubernetes.interactive import PodSandboxRuntime
from ringfence.config import Config
from ringfence.models import ResourceLimits, Status

from .fake_api import FakeCluster

WAIT = 30  # a bound on every wait, never an expectation
READY = {"phase": "Running", "podIP": "127.0.0.2",
         "conditions": [{"type": "Ready", "status": "True"}]}  # fmt: skip


class LateWatches(FakeCluster):
    """Every watch but the first begins only once something was deleted: a pool thread
    that starts late, after the loop has moved on."""

    def __init__(self) -> None:
        super().__init__()
        self.watches = 0
        self.a_delete = threading.Event()

    def _subscribe(self, kind: str, events: Any) -> None:
        self.watches += 1
        if self.watches > 1:
            self.a_delete.wait(WAIT)
        super()._subscribe(kind, events)

    def _delete(self, kind: str, name: str, *, foreground: bool = False) -> None:
        super()._delete(kind, name, foreground=foreground)
        self.a_delete.set()

    def close(self) -> None:
        self.a_delete.set()  # no thread of ours waits past the test
        super().close()


@pytest.fixture
async def late() -> AsyncIterator[tuple[LateWatches, PodSandboxRuntime]]:
    with tempfile.TemporaryDirectory(prefix="rf-") as runtime_dir:  # short: unix sockets
        cluster = LateWatches()
        config = Config(backend="job", runtime_dir=Path(runtime_dir))
        runtime = PodSandboxRuntime(config, cluster)  # type: ignore[arg-type]
        yield cluster, runtime
        await runtime.aclose()


async def test_a_sandbox_killed_as_soon_as_it_started_ends(
    late: tuple[LateWatches, PodSandboxRuntime],
) -> None:
    """Failed before the watch that saw the Pod ready was read on: the sandbox's own watch
    began after the delete, saw no Pod, and waited for it to its timeout (and then again)."""
    cluster, runtime = late
    spec = LaunchSpec(image="host", env={}, limits=ResourceLimits(), timeout=600)
    starting = asyncio.create_task(runtime.start(spec))
    async with asyncio.timeout(WAIT):
        while not any(kind == "Pod" for kind, _ in cluster.objects):
            await asyncio.sleep(0.01)
    cluster.set_pod(cluster.pod("rf-s-")["metadata"]["name"], **READY)
    sandbox = await asyncio.wait_for(starting, WAIT)
    async with asyncio.timeout(WAIT):
        result = await sandbox.kill()
    assert result.status is Status.CANCELLED
    assert not sandbox.running


async def test_a_project_view_is_refused_never_ignored() -> None:
    from ringfence.backends._interactive import BoundProject
    from ringfence.errors import StateUnsupported

    with tempfile.TemporaryDirectory(prefix="rf-") as runtime_dir:
        cluster = FakeCluster()
        config = Config(backend="job", runtime_dir=Path(runtime_dir))
        runtime = PodSandboxRuntime(config, cluster)  # type: ignore[arg-type]
        try:
            project = BoundProject(Path("/srv/p"), "/home/user/p")
            spec = LaunchSpec(image="python:3.12-slim", env={}, limits=ResourceLimits(),
                              timeout=60, project=project)  # fmt: skip
            with pytest.raises(StateUnsupported):
                await runtime.start(spec)
            assert not cluster.objects  # nothing was created
        finally:
            await runtime.aclose()
            cluster.close()


async def test_volumes_are_refused_never_ignored() -> None:
    from ringfence.backends._interactive import BoundVolume
    from ringfence.errors import StateUnsupported

    with tempfile.TemporaryDirectory(prefix="rf-") as runtime_dir:
        cluster = FakeCluster()
        config = Config(backend="job", runtime_dir=Path(runtime_dir))
        runtime = PodSandboxRuntime(config, cluster)  # type: ignore[arg-type]
        try:
            volumes = (BoundVolume(Path("/srv/v"), "/mnt/data"),)
            spec = LaunchSpec(image="python:3.12-slim", env={}, limits=ResourceLimits(),
                              timeout=60, volumes=volumes)  # fmt: skip
            with pytest.raises(StateUnsupported, match="volumes"):
                await runtime.start(spec)
            assert not cluster.objects  # nothing was created
        finally:
            await runtime.aclose()
            cluster.close()
