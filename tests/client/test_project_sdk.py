"""A coding agent's session on a project directory, end to end on real sandboxes: a real
server (``ringfence serve`` with ``RINGFENCE_PROJECT_ROOTS``), the SDK (async and
blocking) and the CLI. The agent edits its view, the diff is exact, the host directory is
unchanged until a partial sync applies only the chosen files (audited); tenants cannot
name a directory outside the roots, nor reach another tenant's project."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringfence.client import AsyncSandbox, Sandbox
from ringfence.errors import Conflict, Forbidden, InvalidRequest, SandboxNotFound
from ringfence.models import ProjectMount
from tests.client.conftest import LiveServer, _serving
from tests.server.test_serve_process import RINGFENCE, Server

pytestmark = pytest.mark.integration
OWNER = 4242


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project-roots")
    root.chmod(0o755)
    return root


@pytest.fixture(scope="module")
def served(roots: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"RINGFENCE_PROJECT_ROOTS": json.dumps([str(roots)]), "RINGFENCE_POOL_SIZES": "{}"}
    yield from _serving(Server(tmp_path_factory.mktemp("live") / "data", None, env=env))


def _repo(root: Path, name: str) -> Path:
    repo = root / name
    (repo / "src").mkdir(parents=True)
    (repo / "src/app.py").write_text("def answer():\n    return 41\n")
    (repo / "tests").mkdir()
    (repo / "tests/test_app.py").write_text("from src.app import answer\n")
    (repo / "NOTES").write_text("notes\n")
    for path in [repo, *repo.rglob("*")]:
        os.chown(path, OWNER, OWNER)
    return repo


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "d"
        for p in sorted(root.rglob("*"))
    }


async def test_a_coding_agents_session_on_a_project(served: LiveServer, roots: Path) -> None:
    repo = _repo(roots, "agent-repo")
    before = _digest(repo)
    async with await AsyncSandbox.create(
        url=served.url, api_key=served.key, project=str(repo)
    ) as sbx:
        assert (await sbx.info()).project == ProjectMount(source=str(repo))
        edit = (
            "cd /home/user/project && sed -i 's/41/42/' src/app.py && "
            "echo 'def test(): assert answer() == 42' >> tests/test_app.py && "
            "rm NOTES && echo '# new' > CHANGELOG && id -u && stat -c %u src/app.py"
        )
        result = await sbx.commands.run(edit)
        assert result.stdout == "1000\n1000\n"

        diff = await sbx.project.diff()
        assert diff.source == str(repo) and diff.path == "/home/user/project"
        assert [(c.path, c.action) for c in diff.changes] == [
            ("CHANGELOG", "added"), ("NOTES", "deleted"),
            ("src/app.py", "modified"), ("tests/test_app.py", "modified"),
        ]  # fmt: skip
        assert diff.changes[2].diff == (
            "--- a/src/app.py\n+++ b/src/app.py\n@@ -1,2 +1,2 @@\n def answer():\n"
            "-    return 41\n+    return 42\n"
        )
        assert _digest(repo) == before  # unchanged until a sync

        report = await sbx.project.sync(["src/app.py", "tests"])
        assert [c.path for c in report.applied] == ["src/app.py", "tests/test_app.py"]
        assert report.refused == []
        assert (repo / "src/app.py").read_text() == "def answer():\n    return 42\n"
        assert (repo / "NOTES").exists() and not (repo / "CHANGELOG").exists()
        assert (repo / "src/app.py").stat().st_uid == OWNER

        left = await sbx.project.diff()
        assert [c.path for c in left.changes] == ["CHANGELOG", "NOTES"]
        with pytest.raises(InvalidRequest):
            await sbx.project.sync(["../outside"])
        with pytest.raises(InvalidRequest):
            await sbx.project.sync(["/etc/passwd"])

        audit = httpx.get(f"{served.url}/v1/audit", params={"action": "sandbox.project_sync"},
                          headers={"Authorization": f"Bearer {served.key}"})  # fmt: skip
        (record,) = audit.json()
        assert record["details"]["applied"] == ["src/app.py", "tests/test_app.py"]
        assert record["details"]["paths"] == ["src/app.py", "tests"]


def test_the_blocking_sdk_and_another_tenant(served: LiveServer, roots: Path) -> None:
    repo = _repo(roots, "blocking-repo")
    with Sandbox.create(url=served.url, api_key=served.key, project=repo) as sbx:
        sbx.commands.run("echo more >> /home/user/project/NOTES")
        assert [c.path for c in sbx.project.diff().changes] == ["NOTES"]
        with pytest.raises(SandboxNotFound):  # another tenant's sandbox: not found
            Sandbox.connect(sbx.id, url=served.url, api_key=served.other_key)
        other = httpx.get(f"{served.url}/v1/sandboxes/{sbx.id}/project/diff",
                          headers={"X-API-Key": served.other_key})  # fmt: skip
        assert other.status_code == 404
        other = httpx.post(f"{served.url}/v1/sandboxes/{sbx.id}/project/sync", json={},
                           headers={"X-API-Key": served.other_key})  # fmt: skip
        assert other.status_code == 404
        assert sbx.project.sync().applied[0].path == "NOTES"
    assert (repo / "NOTES").read_text() == "notes\nmore\n"


def test_an_agent_key_reads_the_diff_but_cannot_sync(served: LiveServer, roots: Path) -> None:
    repo = _repo(roots, "agent-key-repo")
    agent = served.mint_key("agent")
    with Sandbox.create(url=served.url, api_key=agent, project=repo) as sbx:
        sbx.commands.run("echo agent >> /home/user/project/NOTES")
        assert [c.path for c in sbx.project.diff().changes] == ["NOTES"]
        with pytest.raises(Forbidden, match="agent keys cannot apply"):
            sbx.project.sync()
        env = {**os.environ, "RINGFENCE_URL": served.url, "RINGFENCE_API_KEY": agent}
        refused = subprocess.run(
            [RINGFENCE, "sandbox", "sync", sbx.id], capture_output=True, text=True, env=env
        )
        assert refused.returncode != 0 and "agent keys cannot apply" in refused.stderr
        assert (repo / "NOTES").read_text() == "notes\n"
        admin = Sandbox.connect(sbx.id, url=served.url, api_key=served.key)
        assert [c.path for c in admin.project.sync().applied] == ["NOTES"]
    assert (repo / "NOTES").read_text() == "notes\nagent\n"


def test_a_tenant_cannot_name_a_directory_outside_the_roots(
    served: LiveServer, roots: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (roots / "escape").symlink_to(outside)
    for source in (str(outside), str(roots / "escape"), f"{roots}/../outside", "/etc"):
        with pytest.raises(InvalidRequest) as refused:
            mount = ProjectMount.model_construct(source=source, path="/home/user/project")
            Sandbox.create(url=served.url, api_key=served.key, project=mount)
        assert "RINGFENCE_PROJECT_ROOTS" in refused.value.message or "'..'" in refused.value.message
    with pytest.raises(InvalidRequest):
        Sandbox.create(url=served.url, api_key=served.key, project=roots / "no-such-dir")
    with pytest.raises(InvalidRequest):  # disk pauses hold no project view
        Sandbox.create(url=served.url, api_key=served.key, project=_repo(roots, "paused"),
                       on_timeout="pause")  # fmt: skip
    with Sandbox.create(url=served.url, api_key=served.key) as plain, pytest.raises(Conflict):
        plain.project.diff()


def test_the_cli_creates_diffs_and_syncs_a_relative_directory(
    served: LiveServer, roots: Path
) -> None:
    repo = _repo(roots, "cli-repo")
    env = {**os.environ, "RINGFENCE_URL": served.url, "RINGFENCE_API_KEY": served.key}

    def cli(*args: str, code: int = 0) -> str:
        done = subprocess.run([RINGFENCE, "sandbox", *args], capture_output=True, text=True,
                              env=env, cwd=roots)  # fmt: skip
        assert done.returncode == code, done.stdout + done.stderr
        return done.stdout

    sandbox_id = cli("create", "--project", "cli-repo").strip()
    try:
        script = ("cd /home/user/project && echo x >> NOTES && mkdir docs && echo d > docs/d "
                  "&& ln -s /etc/passwd docs/passwd")  # fmt: skip
        cli("exec", sandbox_id, "--", "sh", "-c", script)
        assert cli("diff", sandbox_id, "--name-only").split() == [
            "NOTES",
            "docs",
            "docs/d",
            "docs/passwd",
        ]
        stat = cli("diff", sandbox_id, "--stat")
        assert "M NOTES | +1 -0\n" in stat and "A docs/\n" in stat
        assert stat.endswith("4 changed, 2 insertions(+), 0 deletions(-)\n")
        full = cli("diff", sandbox_id)
        assert "+x\n" in full and "added link docs/passwd -> /etc/passwd" in full
        report = cli("sync", sandbox_id, "docs", code=1)  # the link out is refused
        assert "A docs/d\n" in report and "refused docs/passwd: a link to the absolute" in report
        assert (repo / "docs/d").read_text() == "d\n" and not (repo / "docs/passwd").exists()
        assert (repo / "NOTES").read_text() == "notes\n"
    finally:
        cli("kill", sandbox_id)


def test_sensitive_paths_through_the_api_the_sdk_and_the_cli(
    served: LiveServer, roots: Path
) -> None:
    repo = _repo(roots, "sensitive-repo")
    with Sandbox.create(url=served.url, api_key=served.key, project=repo) as sbx:
        sbx.commands.run("cd /home/user/project && echo 'curl x | sh' > .envrc && echo ok >> NOTES")
        changes = {c.path: c.sensitive for c in sbx.project.diff().changes}
        assert changes == {".envrc": True, "NOTES": False}
        report = sbx.project.sync()
        assert [c.path for c in report.applied] == ["NOTES"]
        assert [r.path for r in report.refused] == [".envrc"]
        env = {**os.environ, "RINGFENCE_URL": served.url, "RINGFENCE_API_KEY": served.key}
        stat = subprocess.run([RINGFENCE, "sandbox", "diff", sbx.id, "--stat"],
                              capture_output=True, text=True, env=env, check=True)  # fmt: skip
        assert "A!.envrc" in stat.stdout
        assert not (repo / ".envrc").exists()
        subprocess.run([RINGFENCE, "sandbox", "sync", sbx.id, "--include-sensitive", ".envrc"],
                       capture_output=True, text=True, env=env, check=True)  # fmt: skip
    assert (repo / ".envrc").read_text() == "curl x | sh\n"
