"""A project view on real sandboxes (the local runtime): the host directory shown as a
copy-on-write overlay whose lower layer is an idmapped read-only view of it. The sandbox
sees the owner's files as its user's, writes land in its own layer (the host directory is
unchanged until a sync), symlinks in the host directory resolve inside the sandbox's
namespace (never to the host's files), and checkpoints include the project layer."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringfence import projects
from ringfence.backends._interactive import BoundProject, LaunchSpec
from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.backends.local.probe import Host
from ringfence.backends.local.sandbox import LocalSandbox
from ringfence.config import Config
from ringfence.errors import StateUnsupported
from ringfence.models import ResourceLimits
from ringfence.testing.backend_checks import run_in_sandbox

pytestmark = pytest.mark.integration

OWNER = 4242
TARGET = "/home/user/project"


@pytest.fixture
async def runtime(local_host: Host) -> AsyncIterator[LocalSandboxRuntime]:
    if not local_host.volumes:
        pytest.skip(f"no volumes on this host: {'; '.join(local_host.state_missing)}")
    config = Config()
    built = LocalSandboxRuntime(LocalExecutor(config, host=local_host), config, seal_key=b"k" * 32)
    yield built
    await built.aclose()


@pytest.fixture
def host_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src/app.py").write_text("x = 1\n")
    (project / "README").write_text("readme\n")
    (project / "private").write_text("owner only\n")
    (project / "private").chmod(0o600)
    secret = tmp_path / "host-secret"
    secret.write_text("the host's secret\n")
    secret.chmod(0o644)
    os.symlink(str(secret), project / "abs-link")  # the host's path: not the sandbox's
    os.symlink("../host-secret", project / "rel-link")  # leaves the project
    os.symlink("/etc/hostname", project / "etc-link")
    for path in [project, *project.rglob("*")]:
        os.chown(path, OWNER, OWNER, follow_symlinks=False)
    return project


def _tree(root: Path) -> dict[str, str]:
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        what = os.readlink(path) if path.is_symlink() else ""
        if path.is_file() and not path.is_symlink():
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        found[str(path.relative_to(root))] = f"{oct(st.st_mode)} {st.st_uid} {what}"
    return found


async def _start(runtime: LocalSandboxRuntime, source: Path) -> LocalSandbox:
    spec = LaunchSpec(image="host", env={}, limits=ResourceLimits(disk=64 << 20), timeout=120,
                      project=BoundProject(source=source, target=TARGET))  # fmt: skip
    return await runtime.start(spec)


async def _sh(sandbox: LocalSandbox, script: str, user: str | None = None) -> tuple[str, int]:
    output, code = await run_in_sandbox(sandbox, "sh", "-c", script, user=user)
    return output, code or 0


async def test_the_agent_edits_its_view_and_the_host_is_unchanged_until_a_sync(
    runtime: LocalSandboxRuntime, host_project: Path
) -> None:
    before = _tree(host_project)
    sandbox = await _start(runtime, host_project)
    try:
        listing, _ = await _sh(sandbox, f"cd {TARGET} && stat -c '%n %u %g' . src/app.py private")
        owners = [". 1000 1000", "src/app.py 1000 1000", "private 1000 1000"]
        assert listing.split("\n")[:3] == owners
        output, code = await _sh(sandbox, f"cat {TARGET}/private && cd {TARGET} && "
                                 "echo 'x = 2' > src/app.py && echo new > src/new.py && "
                                 "rm README && mkdir -p docs && echo d > docs/d.md")  # fmt: skip
        assert (output, code) == ("owner only\n", 0)
        assert _tree(host_project) == before  # the host's files are never touched

        upper = sandbox.project_layer
        assert upper is not None
        changes, _ = projects.diff(upper, host_project)
        assert [(c.path, c.action) for c in changes] == [
            ("README", "deleted"), ("docs", "added"), ("docs/d.md", "added"),
            ("src/app.py", "modified"), ("src/new.py", "added"),
        ]  # fmt: skip
        app = "--- a/src/app.py\n+++ b/src/app.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
        assert changes[3].diff == app

        applied, refused = projects.sync(upper, host_project, ["src/app.py"])
        assert [c.path for c in applied] == ["src/app.py"] and refused == []
        assert (host_project / "src/app.py").read_text() == "x = 2\n"
        assert (host_project / "src/app.py").stat().st_uid == OWNER
        assert (host_project / "README").exists() and not (host_project / "src/new.py").exists()
    finally:
        await sandbox.kill()


async def test_host_symlinks_resolve_inside_the_sandbox_never_to_host_files(
    runtime: LocalSandboxRuntime, host_project: Path
) -> None:
    sandbox = await _start(runtime, host_project)
    try:
        for user in ("user", "root"):
            script = (f"cd {TARGET}; readlink abs-link; cat abs-link rel-link 2>&1; "
                      "cat etc-link")  # fmt: skip
            output, _ = await _sh(sandbox, script, user=user)
            assert "the host's secret" not in output
            assert output.startswith(str(host_project.parent / "host-secret") + "\n")
            assert output.rstrip().endswith("sandbox")  # the sandbox's /etc/hostname
        # Nor can the view be climbed out of: its parent is the sandbox's own workspace.
        output, _ = await _sh(sandbox, f"ls -a {TARGET}/..; cat {TARGET}/../host-secret 2>&1")
        assert "the host's secret" not in output
        # The view is read-only below the sandbox's layer: nothing reaches the host dir.
        await _sh(sandbox, f"chmod 4755 {TARGET}/src/app.py; rm -rf {TARGET}/src", user="root")
        assert (host_project / "src/app.py").read_text() == "x = 1\n"
        mounts, _ = await _sh(sandbox, "cat /proc/self/mountinfo")
        assert str(host_project) not in mounts
    finally:
        await sandbox.kill()


async def test_checkpoints_include_the_project_layer_and_exports_are_refused(
    runtime: LocalSandboxRuntime, host_project: Path
) -> None:
    sandbox = await _start(runtime, host_project)
    try:
        await _sh(sandbox, f"echo one > {TARGET}/kept.txt")
        checkpoint = await sandbox.checkpoint()
        await _sh(sandbox, f"echo two > {TARGET}/kept.txt; rm {TARGET}/README; "
                           f"echo extra > {TARGET}/extra")  # fmt: skip
        await sandbox.rollback(checkpoint.id)
        output, _ = await _sh(sandbox, f"cat {TARGET}/kept.txt {TARGET}/README; ls {TARGET}")
        assert output.startswith("one\nreadme\n") and "extra" not in output
        with pytest.raises(StateUnsupported):
            await sandbox.export(checkpoint.id, host_project.parent / "export")
    finally:
        await sandbox.kill()
    assert sandbox.project_layer is None


async def test_a_mount_inside_the_source_is_not_shown(
    runtime: LocalSandboxRuntime, host_project: Path, tmp_path: Path
) -> None:
    import subprocess

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mounted-secret").write_text("from another mount\n")
    (host_project / "mnt").mkdir()
    subprocess.run(["mount", "--bind", str(elsewhere), str(host_project / "mnt")], check=True)
    try:
        sandbox = await _start(runtime, host_project)
        try:
            output, _ = await _sh(sandbox, f"ls -A {TARGET}/mnt; cat {TARGET}/mnt/* 2>&1",
                                  user="root")  # fmt: skip
            assert "from another mount" not in output and "mounted-secret" not in output
        finally:
            await sandbox.kill()
    finally:
        subprocess.run(["umount", str(host_project / "mnt")], check=True)
