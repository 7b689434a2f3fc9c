"""Which host directories a tenant may name for a project view (``bind_project``,
``check_project``): only under the operator's roots, symlinks resolved first, and only
where the server can give a view."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ProjectMount, SandboxSpec
from ringfence.service import sandbox_projects
from ringfence.service.sandbox_projects import (
    SandboxProjects,
    bind_project,
    check_project,
    roots_of,
)


def _mount(source: Path | str) -> ProjectMount:
    return ProjectMount.model_construct(source=str(source), path="/home/user/project")


OWNER = 4242


def _owned(*paths: Path) -> None:
    for path in paths:
        os.chown(path, OWNER, OWNER, follow_symlinks=False)


def test_no_roots_refuses_every_source_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as refused:
        bind_project(_mount(tmp_path), [])
    assert "RINGFENCE_PROJECT_ROOTS" in refused.value.message


def test_sources_under_a_root_are_bound_resolved(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "repo").mkdir(parents=True)
    _owned(root / "repo")
    (root / "alias").symlink_to(root / "repo")
    assert bind_project(_mount(root / "repo"), [root]).source == root / "repo"
    assert bind_project(_mount(root / "alias"), [root]).source == root / "repo"
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
    (tmp_path / "repo").mkdir()
    _owned(tmp_path / "repo")
    spec = SandboxSpec(project=ProjectMount(source=str(tmp_path / "repo")))
    check_project(spec, Config(project_roots=[tmp_path]), "t")
    with pytest.raises(InvalidRequest):
        check_project(spec, Config(project_roots=[tmp_path], backend="job"), "t")
    for lifecycle in ({"auto_pause": 60.0}, {"on_timeout": "pause"}):
        paused = spec.model_copy(update=lifecycle)
        with pytest.raises(InvalidRequest):
            check_project(paused, Config(project_roots=[tmp_path]), "t")
    check_project(SandboxSpec(), Config(), "t")  # no project: nothing to check


def test_a_tenant_names_only_under_its_own_roots(tmp_path: Path) -> None:
    # The attack: with one server-wide list, tenant B named tenant A's checkout and read
    # and synced it. Roots are per tenant now; "*" and "{tenant}" give the rest theirs.
    for name in ("a", "b", "c"):
        (tmp_path / name / "repo").mkdir(parents=True)
        _owned(tmp_path / name / "repo")
    config = Config(project_roots={"a": [tmp_path / "a"], "*": [tmp_path / "{tenant}"]})
    a_repo, b_repo, c_repo = (_mount(tmp_path / n / "repo") for n in ("a", "b", "c"))
    check_project(SandboxSpec(project=a_repo), config, "a")
    check_project(SandboxSpec(project=b_repo), config, "b")  # "*": its own {tenant}
    for tenant, mount in (("b", a_repo), ("a", b_repo), ("c", a_repo), ("b", c_repo)):
        with pytest.raises(InvalidRequest, match="not under a project root of this tenant"):
            check_project(SandboxSpec(project=mount), config, tenant)
    assert roots_of(config, "../etc") == []  # a name that is no path component: nothing
    assert roots_of(config, None) == []
    # The setting as JSON, both forms (a plain list: every tenant, for one-tenant servers).
    mapped = Config.model_validate({"project_roots": json.loads('{"a": ["/srv/a"]}')})
    assert roots_of(mapped, "a") == [Path("/srv/a")] and roots_of(mapped, "b") == []
    listed = Config.model_validate({"project_roots": ["/srv"]})
    assert roots_of(listed, "a") == roots_of(listed, "b") == [Path("/srv")]


def test_a_root_itself_and_a_root_owned_source_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "repo").mkdir(parents=True)  # root-owned (the tests run as root)
    _owned(root)
    with pytest.raises(InvalidRequest, match="a project root itself"):
        bind_project(_mount(root), [root])
    with pytest.raises(InvalidRequest, match="belongs to root"):
        bind_project(_mount(root / "repo"), [root])
    assert bind_project(_mount(root / "repo"), [root], allow_root_owned=True).source == (
        root / "repo"
    )
    with pytest.raises(InvalidRequest, match="belongs to root"):
        check_project(SandboxSpec(project=_mount(root / "repo")), Config(project_roots=[root]), "t")
    allowed = Config(project_roots=[root], allow_root_owned_projects=True)
    check_project(SandboxSpec(project=_mount(root / "repo")), allowed, "t")


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
