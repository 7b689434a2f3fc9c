"""``apt-get install`` as root inside (issue 16): through an egress policy that allows only
Debian's mirror, in a sandbox of the run's ``dev`` template (built once and shared with
test_dev.py: ``_shared``), and host uid 0 owns nothing it made. Minutes the first time
(debootstrap downloads; cached after)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.backends.local.probe import Host
from ringfence.config import Config
from ringfence.models import NetworkMode, NetworkPolicy, ResourceLimits
from ringfence.models.network import EgressRule
from ringfence.testing.backend_checks import run_in_sandbox
from tests.templates._shared import shared_template

pytestmark = [pytest.mark.integration, pytest.mark.debootstrap]


@pytest.fixture(scope="module")
def base_rootfs() -> Path:
    """A Debian template with apt (the ``dev`` recipe is ``base`` and more)."""
    assert shutil.which("debootstrap"), "scripts/setup installs debootstrap"
    return shared_template("dev").rootfs


def _owned_by_host_root(top: Path) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            info = os.lstat(os.path.join(directory, name))
            if info.st_uid == 0 or info.st_gid == 0:
                found.append(os.path.join(directory, name))
    return found


@pytest.mark.timeout(1800)
async def test_apt_get_installs_as_root_inside_and_host_root_owns_nothing_it_made(
    base_rootfs: Path, local_host: Host
) -> None:
    if not local_host.volumes:
        pytest.fail(f"no writable root here: {'; '.join(local_host.state_missing)}")
    config = Config()
    executor = LocalExecutor(config, host=local_host)
    runtime = LocalSandboxRuntime(executor, config)
    debian = NetworkPolicy(mode=NetworkMode.RULES, rules=[EgressRule(domain="deb.debian.org")])
    spec = LaunchSpec(
        image=str(base_rootfs), env={}, limits=ResourceLimits(disk=512 << 20), timeout=900,
        network=debian,
    )  # fmt: skip
    sandbox = await runtime.start(spec)
    try:
        install = "apt-get update -q && apt-get install -y -q tree && tree --version"
        out, code = await run_in_sandbox(sandbox, "sh", "-c", install + " 2>&1", user="root")
        assert code == 0 and "tree v" in out, out[-3000:]
        out, code = await run_in_sandbox(sandbox, "sh", "-c", "id -un; tree --version")
        assert code == 0 and out.startswith("user\ntree v"), "the user runs what root installed"
        # Without root, the system stays root's.
        out, code = await run_in_sandbox(sandbox, "sh", "-c", "apt-get install -y -q jq 2>&1")
        assert code != 0 and "are you root" in out, out[-2000:]
        parts = executor.parts(sandbox._inner._run_id)
        assert parts is not None and parts.volume is not None
        volume = parts.volume
        root_uid, user_uid = volume.owners
        uppers = {layer.target: layer.upper for layer in volume.layers}
        assert (uppers["/usr"] / "bin/tree").stat().st_uid == root_uid != 0
        for top in (*uppers.values(), volume.workspace, volume.tmp):
            assert _owned_by_host_root(top) == [], top
        for top in uppers.values():  # only the sandbox's two ids: never a third, never 0
            assert {os.lstat(path).st_uid for path in _every_path(top)} <= {root_uid, user_uid}
    finally:
        await sandbox.kill()
        await runtime.aclose()


def _every_path(top: Path) -> Iterator[str]:
    for directory, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            yield os.path.join(directory, name)
