"""Sandboxes made from templates run the template's own binaries and cannot change it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ExecutionRequest, Status
from ringfence.templates import (
    Registry,
    TemplateNotFound,
    TemplateUnusable,
    import_template,
    resolve,
)
from tests.templates._images import busybox_layers, docker_archive

pytestmark = pytest.mark.integration


@pytest.fixture
def config(open_tmp: Path) -> Config:
    return Config(data_dir=open_tmp / "data")


@pytest.fixture
def busybox_template(config: Config, open_tmp: Path) -> str:
    import_template(config, "bb", docker_archive(open_tmp / "image.tar", busybox_layers()))
    return resolve("bb", config)


async def test_an_imported_image_runs_its_own_busybox_and_sees_the_whiteouts(
    local_executor: LocalExecutor, busybox_template: str
) -> None:
    result = await local_executor.execute(
        ExecutionRequest(
            image=busybox_template,
            command=["/bin/sh", "-c"],
            args=[
                "cat /etc/kept.txt; ls /opaque; test -e /etc/gone.txt || echo gone; "
                "cat /private/secret; ls /usr >/dev/null 2>&1 || echo no-usr; id -un"
            ],
            env={"PATH": "/bin"},
        )
    )
    assert result.status is Status.SUCCEEDED, result.logs
    assert result.logs.split("\n") == [
        "second", "new.txt", "gone", "readable now", "no-usr", "user", ""
    ]  # fmt: skip


async def test_a_sandbox_cannot_change_its_template(
    local_executor: LocalExecutor, busybox_template: str
) -> None:
    root = Path(busybox_template)
    before = {p: p.read_bytes() for p in (root / "etc" / "kept.txt", root / "bin" / "busybox")}
    attempts = [
        "echo changed > /etc/kept.txt",
        "echo new > /bin/new",
        "rm -f /bin/cat",
        "echo x > /opaque/new.txt",
        "mkdir /newdir",
        "chmod 777 /etc",
        "touch /private/secret",
    ]
    script = "".join(f"({a}) 2>/dev/null && echo changed || echo refused; " for a in attempts)
    script += "grep -E ' /(bin|etc|opaque) ' /proc/self/mounts | cut -d' ' -f2,4 | cut -d, -f1"
    result = await local_executor.execute(
        ExecutionRequest(
            image=busybox_template, command=["/bin/sh", "-c", script], env={"PATH": "/bin"}
        )
    )
    lines = result.logs.splitlines()
    assert lines[: len(attempts)] == ["refused"] * len(attempts), result.logs
    mounts = dict(line.split() for line in lines[len(attempts) :])
    assert mounts == {"/bin": "ro", "/etc": "ro", "/opaque": "ro"}, result.logs
    assert {p: p.read_bytes() for p in before} == before
    assert (root / "bin" / "cat").is_symlink() and not (root / "bin" / "new").exists()
    assert sorted(os.listdir(root / "opaque")) == ["new.txt"]
    assert not (root / "newdir").exists()


def test_resolve_refuses_what_a_sandbox_could_not_or_must_not_use(
    config: Config, open_tmp: Path, busybox_template: str
) -> None:
    with pytest.raises(TemplateNotFound) as missing:
        resolve("nope", config)
    assert missing.value.code == "not_found" and "bb" in missing.value.message
    with pytest.raises(InvalidRequest):
        resolve("../bb", config)
    # Out of the sandbox user's reach: under a directory only root may enter.
    private = open_tmp / "private"
    private.mkdir(mode=0o700)
    hidden = Registry(private / "templates", sandbox_uid=64000)
    hidden.prepare()
    shutil.copytree(Path(busybox_template).parent, private / "templates" / "bb", symlinks=True)
    with pytest.raises(TemplateUnusable) as unreachable:
        hidden.resolve("bb")
    assert unreachable.value.code == "sandbox_error" and "o+x" in unreachable.value.message
    # Changeable by others: what it holds would run as every sandbox made from it.
    template_dir = Path(busybox_template).parent
    template_dir.chmod(0o777)
    try:
        with pytest.raises(TemplateUnusable):
            resolve("bb", config)
    finally:
        template_dir.chmod(0o755)
