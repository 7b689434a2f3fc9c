"""The sandbox service's lifecycle edges, on real sandboxes: a daemon that never starts, a
create that is abandoned half-way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.config import Config
from ringfence.errors import InvalidRequest, SandboxError
from ringfence.models import SandboxSpec, SandboxState
from ringfence.service.budget import Budget
from ringfence.service.sandboxes import SandboxService
from ringfence.store import MemoryStore
from ringfence.templates import import_template
from tests.server.test_sandboxes_api import _assert_nothing_remains


async def _service(local_host: object, config: Config) -> AsyncIterator[SandboxService]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    executor = LocalExecutor(config, host=local_host)
    service = SandboxService(
        MemoryStore(), LocalSandboxRuntime(executor, config), config,
        budget=Budget.for_server(config),
    )  # fmt: skip
    yield service
    await service.aclose()


@pytest.fixture
async def service(local_host: object) -> AsyncIterator[SandboxService]:
    async for service in _service(local_host, Config()):
        yield service


@pytest.fixture
async def no_python(local_host: object, open_tmp: Path) -> AsyncIterator[SandboxService]:
    """Sandboxes whose root filesystem has a shell but no python3 for the daemon."""
    for name in ("usr", "bin", "lib", "lib64"):
        source = Path("/", name)
        if source.is_symlink():
            (open_tmp / name).symlink_to(source.readlink())
        elif name != "usr":
            (open_tmp / name).mkdir()
    (open_tmp / "usr").mkdir()
    async for service in _service(local_host, Config(default_image=str(open_tmp))):
        yield service


async def test_a_daemon_that_never_starts_is_a_failed_sandbox(no_python: SandboxService) -> None:
    with pytest.raises(SandboxError) as raised:
        await no_python.create("acme", SandboxSpec())
    assert "daemon" in raised.value.message or "python3" in raised.value.message
    [sandbox] = await no_python.list("acme")
    assert sandbox.state is SandboxState.FAILED and sandbox.error, sandbox
    _assert_nothing_remains(sandbox.id)


async def test_an_abandoned_create_leaves_nothing(service: SandboxService) -> None:
    for delay in (0.0, 0.005, 0.02, 0.05):
        creating = asyncio.create_task(service.create("acme", SandboxSpec()))
        await asyncio.sleep(delay)
        creating.cancel()
        try:
            sandbox = await creating  # it finished before the cancel: kill it ourselves
            await service.kill("acme", sandbox.id)
        except asyncio.CancelledError:
            pass
    for sandbox in await service.list("acme"):
        for _ in range(100):
            if (await service.get("acme", sandbox.id)).state is not SandboxState.RUNNING:
                break
            await asyncio.sleep(0.05)
        assert (await service.get("acme", sandbox.id)).state is not SandboxState.RUNNING
        # A cancelled start is recorded as failed at once; the runtime's teardown of what
        # it had started (processes, socket, cgroup) goes on in the background: bounded.
        for _ in range(300):
            try:
                _assert_nothing_remains(sandbox.id)
                break
            except AssertionError:
                await asyncio.sleep(0.05)
        _assert_nothing_remains(sandbox.id)


async def test_a_template_without_python3_is_refused_naming_it(
    local_host: object, open_tmp: Path
) -> None:
    from tests.templates._images import busybox_layers, docker_archive

    config = Config(data_dir=open_tmp / "data")
    import_template(config, "bb", docker_archive(open_tmp / "image.tar", busybox_layers()))
    async for service in _service(local_host, config):
        with pytest.raises(InvalidRequest) as raised:
            await service.create("acme", SandboxSpec(template="bb"))
        assert raised.value.code == "invalid_request"
        assert "python3" in raised.value.message and "'bb'" in raised.value.message
        assert await service.list("acme") == []  # refused before anything started
