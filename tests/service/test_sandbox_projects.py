"""Which host directories a tenant may name for a project view (``bind_project``,
``check_project``): only under the operator's roots, symlinks resolved first, and only
where the server can give a view."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ProjectMount, SandboxSpec
from ringfence.service import sandbox_projects
from ringfence.service.sandbox_projects import SandboxProjects, bind_project, check_project


def _mount(source: Path | str) -> ProjectMount:
    return ProjectMount.model_construct(source=str(source), path="/home/user/project")


def test_no_roots_refuses_every_source_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as refused:
        bind_project(_mount(tmp_path), [])
    assert "RINGFENCE_PROJECT_ROOTS" in refused.value.message


def test_sources_under_a_root_are_bound_resolved(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "repo").mkdir(parents=True)
    (root / "alias").symlink_to(root / "repo")
    assert bind_project(_mount(root / "repo"), [root]).source == root / "repo"
    assert bind_project(_mount(root / "alias"), [root]).source == root / "repo"
    assert bind_project(_mount(root), [root]).source == root  # a root is a project too
    link_root = tmp_path / "link-root"
    link_root.symlink_to(root)
    assert bind_project(_mount(root / "repo"), [link_root]).source == root / "repo"


def test_sources_leaving_the_roots_are_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    (tmp_path / "root-sibling").mkdir()  # a prefix of the root's name is not under it
    for source in (outside, root / "escape", tmp_path / "root-sibling", "/"):
        with pytest.raises(InvalidRequest) as refused:
            bind_project(_mount(source), [root])
        assert "RINGFENCE_PROJECT_ROOTS" in refused.value.message, source
    (root / "file").write_text("x")
    for source in (root / "file", root / "missing"):
        with pytest.raises(InvalidRequest):
            bind_project(_mount(source), [root])


def test_only_the_local_backend_and_no_disk_pause(tmp_path: Path) -> None:
    spec = SandboxSpec(project=ProjectMount(source=str(tmp_path)))
    check_project(spec, Config(project_roots=[tmp_path]))
    with pytest.raises(InvalidRequest):
        check_project(spec, Config(project_roots=[tmp_path], backend="job"))
    for lifecycle in ({"auto_pause": 60.0}, {"on_timeout": "pause"}):
        paused = spec.model_copy(update=lifecycle)
        with pytest.raises(InvalidRequest):
            check_project(paused, Config(project_roots=[tmp_path]))
    check_project(SandboxSpec(), Config())  # no project: nothing to check


class _Fake:
    """The sandbox service as the project operations see it: every id has a view."""

    async def live(self, tenant: str, sandbox_id: str, *, actor: str = "") -> object:
        return SimpleNamespace(project_layer=Path("/nonexistent/upper"))

    def launch_of(self, tenant: str, sandbox_id: str) -> object:
        return SimpleNamespace(project=SimpleNamespace(source=Path("/src"), target="/p"))

    def record(self, *args: object, **kwargs: object) -> None:
        pass


async def test_many_slow_diffs_never_take_the_default_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The attack: diffs of hostile layers are slow; asyncio's default executor (6 workers
    # here) is shared with sandbox starts, checkpoints and volumes. Project work has its
    # own two workers and one turn per sandbox, so the default executor stays free.
    release = threading.Event()
    running: list[str] = []

    def slow_diff(upper: Path, source: Path) -> tuple[list[object], bool]:
        running.append(threading.current_thread().name)
        release.wait(10)
        return [], False

    monkeypatch.setattr(sandbox_projects.projects, "diff", slow_diff)
    service = SandboxProjects(_Fake())
    asked = [asyncio.ensure_future(service.diff("t", f"sb-{index % 10}")) for index in range(40)]
    try:
        for _ in range(100):  # the workers are all busy, bounded wait
            if len(running) >= sandbox_projects.PROJECT_WORKERS:
                break
            await asyncio.sleep(0.01)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 2) == "free"
        assert len(running) == sandbox_projects.PROJECT_WORKERS
    finally:
        release.set()
        answers = await asyncio.wait_for(asyncio.gather(*asked), 20)
    assert len(answers) == 40 and all(a.changes == [] for a in answers)
    assert all(name.startswith("rf-project") for name in running)
