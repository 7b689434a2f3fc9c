"""Every executor and sandbox runtime, fresh for each test, built for the conformance checks
(``ringfence.testing.backend_checks``): ``process``, ``local`` (real sandboxes), ``job``
(the Kubernetes API stand-in with a stand-in kubelet, ``kubelet``) and the fakes."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringfence.backends import Executor, SandboxRuntime
from ringfence.testing.backend_checks import checked_config
from ringfence.testing.fakes import FakeExecutor, FakeSandboxRuntime

EXECUTORS = ["fake", "process", "local", "job"]
RUNTIMES = ["fake", "local", "job"]


@pytest.fixture(params=EXECUTORS)
async def executor(request: pytest.FixtureRequest) -> AsyncIterator[Executor]:
    built = _executor(request.param, request)
    yield built
    await built.aclose()
    cluster = getattr(built, "cluster", None)
    if cluster is not None:  # the executor leaves it open for the Pod runtime to close
        cluster.close()


def _executor(name: str, request: pytest.FixtureRequest) -> Executor:
    config = checked_config()
    if name == "fake":
        return FakeExecutor(config)
    if name == "process":
        from ringfence.backends.process import ProcessExecutor

        return ProcessExecutor(config)
    if name == "local":
        from ringfence.backends.local import LocalExecutor

        return LocalExecutor(config, host=request.getfixturevalue("local_host"))
    if name == "job":
        from ringfence.backends.kubernetes.backend import JobExecutor
        from tests.backends.kubelet import KubeletCluster

        return JobExecutor(checked_config(backend="job"), KubeletCluster())  # type: ignore[arg-type]
    raise AssertionError(name)


@pytest.fixture(params=RUNTIMES)
async def runtime(request: pytest.FixtureRequest) -> AsyncIterator[SandboxRuntime]:
    with tempfile.TemporaryDirectory(prefix="rf-") as runtime_dir:  # short: unix sockets
        Path(runtime_dir).chmod(0o755)  # the sandbox user reads the daemon's copy in it
        config = checked_config(runtime_dir=Path(runtime_dir))
        built: SandboxRuntime
        if request.param == "fake":
            built = FakeSandboxRuntime(config)
        elif request.param == "local":
            from ringfence.backends.local import LocalExecutor
            from ringfence.backends.local.interactive import LocalSandboxRuntime

            host = request.getfixturevalue("local_host")
            built = LocalSandboxRuntime(LocalExecutor(config, host=host), config)
        elif request.param == "job":
            from ringfence.backends.kubernetes.interactive import PodSandboxRuntime
            from tests.backends.kubelet import KubeletCluster

            port = _free_port()  # on every Pod's address: each has its own (127.0.x.y)
            config = config.model_copy(update={"backend": "job", "kubernetes_daemon_port": port})
            built = PodSandboxRuntime(config, KubeletCluster())  # type: ignore[arg-type]
        else:
            raise AssertionError(request.param)
        yield built
        await built.aclose()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
