"""Every executor and sandbox runtime, fresh for each test, built for the conformance checks
(``ringfence.testing.backend_checks``): ``process``, ``local`` (real sandboxes), ``job``
(the Kubernetes API stand-in with a stand-in kubelet) and the fakes."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringfence.backends import Executor, SandboxRuntime
from ringfence.testing.backend_checks import checked_config
from ringfence.testing.fakes import FakeExecutor, FakeSandboxRuntime

EXECUTORS = ["fake", "process", "local"]
RUNTIMES = ["fake", "local"]


@pytest.fixture(params=EXECUTORS)
async def executor(request: pytest.FixtureRequest) -> AsyncIterator[Executor]:
    built = _executor(request.param, request)
    yield built
    await built.aclose()


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
        else:
            raise AssertionError(request.param)
        yield built
        await built.aclose()
