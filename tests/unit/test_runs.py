import time

import pytest

from ringfence.backends._output import BoundedLog
from ringfence.backends._runs import Run, RunTable
from ringfence.errors import DuplicateExecution, ExecutionNotFound
from ringfence.models import Status


def _run(execution_id: str) -> Run:
    return Run(id=execution_id, log=BoundedLog(1024), backend="test")


def _finish(table: RunTable, run: Run) -> None:
    run.move_to(Status.RUNNING)
    run.move_to(Status.SUCCEEDED)
    table.finished(run)


def test_a_duplicate_id_is_refused_while_running_and_while_retained() -> None:
    table = RunTable(ttl=60, max_finished=10)
    run = _run("a")
    table.add(run)
    with pytest.raises(DuplicateExecution) as exc:
        table.add(_run("a"))
    assert exc.value.code == "duplicate_id"
    _finish(table, run)
    with pytest.raises(DuplicateExecution):
        table.add(_run("a"))


def test_an_unknown_id_is_not_found() -> None:
    with pytest.raises(ExecutionNotFound) as exc:
        RunTable(ttl=60, max_finished=10).get("nope")
    assert exc.value.code == "not_found"


def test_finished_results_are_forgotten_after_the_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    table = RunTable(ttl=10, max_finished=10)
    run = _run("a")
    table.add(run)
    _finish(table, run)
    assert table.get("a") is run
    later = time.monotonic() + 11
    monkeypatch.setattr(time, "monotonic", lambda: later)
    with pytest.raises(ExecutionNotFound):
        table.get("a")


def test_at_most_max_finished_results_are_kept_oldest_first() -> None:
    table = RunTable(ttl=3600, max_finished=2)
    for name in "abc":
        run = _run(name)
        table.add(run)
        _finish(table, run)
    with pytest.raises(ExecutionNotFound):
        table.get("a")
    assert table.get("b").id == "b" and table.get("c").id == "c"


def test_running_runs_are_never_forgotten() -> None:
    table = RunTable(ttl=0, max_finished=1)
    running = _run("r")
    table.add(running)
    for name in "xyz":
        run = _run(name)
        table.add(run)
        _finish(table, run)
    assert table.get("r") is running
    assert table.running() == [running]


def test_the_result_reflects_the_run() -> None:
    run = _run("a")
    run.move_to(Status.RUNNING)
    run.log.write(b"out")
    result = run.result()
    assert result.status is Status.RUNNING and result.logs == "out"
    assert result.started_at is not None and result.finished_at is None
