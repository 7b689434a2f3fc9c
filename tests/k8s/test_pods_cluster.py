"""Interactive sandboxes as Pods against a real cluster: run only when KUBECONFIG is set.

No Kubernetes cluster can run on the machines these tests are developed on, so this is part
of the one group of tests CI may skip. The control plane reaches a Pod at its IP, so run
these where Pod IPs are routable (inside the cluster, or kind on Linux).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.kubernetes._client import Cluster
from ringfence.backends.kubernetes.interactive import PodSandboxRuntime
from ringfence.config import Config
from ringfence.errors import SandboxError
from ringfence.models import ResourceLimits, Status
from ringfence.service.daemon_client import DaemonClient

pytestmark = pytest.mark.skipif(
    not os.environ.get("KUBECONFIG"),
    reason="no Kubernetes cluster can run on these machines: set KUBECONFIG to a real "
    "cluster (with ringfence k8s render applied) to run the Pod runtime's end-to-end tests",
)


@pytest.fixture
async def runtime(tmp_path: object) -> AsyncIterator[PodSandboxRuntime]:
    config = Config(backend="job", runtime_dir=tmp_path)
    pods = PodSandboxRuntime(config, Cluster())
    yield pods
    await pods.aclose()


def _spec(timeout: float = 120, image: str = "host") -> LaunchSpec:
    return LaunchSpec(image=image, env={"X": "1"}, limits=ResourceLimits(memory=256 << 20,
                      cpus=0.5, disk=64 << 20), timeout=timeout)  # fmt: skip


async def test_a_pod_serves_its_daemon_until_killed(runtime: PodSandboxRuntime) -> None:
    sandbox = await runtime.start(_spec())
    client = DaemonClient("e2e", sandbox.socket_path)
    try:
        await client.health(30)
    finally:
        await client.aclose()
    assert (await sandbox.kill()).status is Status.CANCELLED
    assert not sandbox.running and not sandbox.socket_path.exists()


async def test_a_pod_expires_at_its_timeout_which_can_move(runtime: PodSandboxRuntime) -> None:
    sandbox = await runtime.start(_spec(timeout=600))
    await sandbox.set_timeout(2)
    assert (await sandbox.ended()).status is Status.TIMED_OUT


async def test_an_image_that_cannot_be_pulled_fails_the_start(runtime: PodSandboxRuntime) -> None:
    with pytest.raises(SandboxError) as caught:
        await runtime.start(_spec(image="registry.invalid/none:0"))
    assert "image" in caught.value.message
