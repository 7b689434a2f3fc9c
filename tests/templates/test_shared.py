"""``_shared``: one build per run and recipe, reused; the run's templates removed by its
last worker, and a dead run's by the next one (the build itself is replaced by a stub)."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from tests.templates import _shared


@pytest.fixture
def stubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    builds: list[str] = []

    def build(recipe: str, home: Path, timeout: float) -> None:
        builds.append(recipe)
        (home / "ringfence-templates" / recipe / "rootfs").mkdir(parents=True)
        (home / "done").write_text("1.5\nthe log")

    monkeypatch.setattr(_shared, "ROOT", tmp_path / "shared")
    monkeypatch.setattr(_shared, "_build", build)
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "run-a")
    monkeypatch.setattr(_shared, "_alive", {})
    return builds


def test_a_recipe_is_built_once_per_run_and_removed_by_its_last_worker(
    stubbed: list[str], tmp_path: Path
) -> None:
    first = _shared.shared_template("dev")
    again = _shared.shared_template("dev")
    assert stubbed == ["dev"] and first == again
    assert (first.log, first.seconds) == ("the log", 1.5)
    other_worker = open(tmp_path / "shared" / "run-a.alive")  # noqa: SIM115
    fcntl.flock(other_worker, fcntl.LOCK_SH)
    _shared.release()
    assert first.rootfs.is_dir(), "another worker of the run still holds it"
    other_worker.close()
    _shared._hold_alive("run-a")
    _shared.release()
    assert not (tmp_path / "shared" / "run-a").exists()


def test_a_dead_runs_templates_are_swept(
    stubbed: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _shared.shared_template("dev")
    _shared._alive["run-a"].close()  # the run died without releasing
    _shared._alive.clear()
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "run-b")
    _shared.shared_template("dev")
    assert not dead.rootfs.exists() and stubbed == ["dev", "dev"]
    _shared.release()
