"""The shipped ``dev`` recipe: a real build (shared by the run: ``_shared``), with its
progress, and every tool it promises running inside a sandbox made from it; the template
stays read-only to every sandbox, whose own changes land in its writable root (issue 16)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from ringfence.backends import LiveSandbox
from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.backends.local.probe import Host
from ringfence.config import Config
from ringfence.models import ResourceLimits
from ringfence.templates import Registry
from ringfence.templates.build import PYPI_RECIPES, RECIPES
from ringfence.testing.backend_checks import run_in_sandbox
from tests.templates._shared import Built, shared_template

# The first test to run waits for the build (minutes): each is bounded as a build is.
pytestmark = [pytest.mark.integration, pytest.mark.debootstrap, pytest.mark.timeout(1800)]

# Each tool the recipe promises, and what its answer starts with (or contains).
TOOLS = {
    "git --version": "git version 2.",
    "gh --version": "gh version 2.",
    "go version": "go version go1.",
    "node -e 'console.log(6 * 7)'": "42",
    "npm --version": "9.",
    "python3 --version": "Python 3.11",
    "python3 -m pip --version": "pip 23.",
    "uv --version": "uv 0.13.8",
    "echo '{\"a\": [1, 2]}' | jq -c .a": "[1,2]",
    "curl --version": "curl 7.",
    "make --version": "GNU Make",
}


@pytest.fixture(scope="module")
def dev() -> Built:
    built = shared_template("dev")
    print(f"\ndev template: built in {built.seconds:.0f} s")  # see docs/templates.md
    return built


@pytest.fixture
async def sandbox(dev: Built, local_host: Host) -> AsyncIterator[LiveSandbox]:
    config = Config()
    runtime = LocalSandboxRuntime(LocalExecutor(config, host=local_host), config)
    spec = LaunchSpec(
        image=str(dev.rootfs), env={}, limits=ResourceLimits(disk=512 << 20, memory=1 << 30),
        timeout=600,
    )  # fmt: skip
    live = await runtime.start(spec)
    try:
        yield live
    finally:
        await live.kill()
        await runtime.aclose()


def test_the_build_shows_its_progress_and_records_what_it_installed(dev: Built) -> None:
    stages = dev.log.splitlines()
    assert "apt-get: configuring packages" in stages
    assert "pip: Successfully installed uv-0.13.8" in stages
    assert len(stages) < 100, "progress is condensed to stage lines"
    template = Registry(dev.rootfs.parent.parent).get("dev")
    assert template.metadata["recipe"] == "dev"
    assert set(RECIPES["dev"]) <= set(template.metadata["packages"])
    assert template.metadata["pypi"] == list(PYPI_RECIPES["dev"])


async def test_every_tool_runs_inside_a_sandbox(sandbox: LiveSandbox) -> None:
    for command, expected in TOOLS.items():
        out, code = await run_in_sandbox(sandbox, "sh", "-c", command + " 2>&1")
        assert code == 0 and expected in out.splitlines()[0] + out, (command, out[-2000:])
    build = (
        "cd /tmp && printf '#include <stdio.h>\\nint main(void){puts(\"cc ok\");return 0;}\\n'"
        " > hello.c && cc -o hello hello.c && ./hello"
        ' && printf \'package main\\nimport "fmt"\\nfunc main(){fmt.Println("go ok")}\\n\''
        " > hello.go && go run hello.go"
        " && uv venv -q /tmp/venv && /tmp/venv/bin/python -c 'print(\"uv ok\")'"
    )
    out, code = await run_in_sandbox(sandbox, "sh", "-c", build + " 2>&1")
    assert code == 0 and out.split() == ["cc", "ok", "go", "ok", "uv", "ok"], out[-3000:]


async def test_the_template_is_read_only_and_root_writes_land_in_its_own_layer(
    dev: Built, sandbox: LiveSandbox
) -> None:
    out, code = await run_in_sandbox(sandbox, "sh", "-c", "touch /usr/bin/mine 2>&1")
    assert code != 0 and "ermission denied" in out, out
    out, code = await run_in_sandbox(
        sandbox, "sh", "-c", "echo mine > /usr/local/bin/mine && cat /usr/local/bin/mine",
        user="root",
    )  # fmt: skip
    assert code == 0 and out == "mine\n", out
    assert not (dev.rootfs / "usr/local/bin/mine").exists(), "the template itself is unchanged"
    info = os.stat(dev.rootfs / "usr/local/bin/uv")
    assert info.st_uid == 0 and not info.st_mode & 0o022, "only Ringfence's user may write it"
