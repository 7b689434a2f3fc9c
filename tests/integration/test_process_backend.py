"""The process backend: no isolation, but the same Executor contract."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from ringfence.backends.process import ProcessExecutor
from ringfence.config import Config
from ringfence.errors import ExecutionNotFound, InvalidRequest
from ringfence.models import ExecutionRequest, NetworkPolicy, Status


@pytest.fixture
async def executor():  # type: ignore[no-untyped-def]
    executor = ProcessExecutor(Config(backend="process"))
    yield executor
    await executor.aclose()


async def test_it_runs_commands_and_reports_their_status(executor: ProcessExecutor) -> None:
    ok = await executor.execute(ExecutionRequest(command=["sh", "-c", "echo hi; echo err >&2"]))
    assert (ok.status, ok.exit_code, ok.logs) == (Status.SUCCEEDED, 0, "hi\nerr\n")
    bad = await executor.execute(ExecutionRequest(command=["sh", "-c", "exit 4"]))
    assert (bad.status, bad.exit_code) == (Status.FAILED, 4)


async def test_only_the_requested_environment_is_passed(executor: ProcessExecutor) -> None:
    result = await executor.execute(ExecutionRequest(command=["env"], env={"ONLY": "this"}))
    names = {line.split("=", 1)[0] for line in result.logs.splitlines()}
    assert "ONLY" in names and names <= {"ONLY", "PATH", "HOME", "PWD", "SHLVL", "_"}


async def test_a_timeout_kills_its_process_group(executor: ProcessExecutor) -> None:
    started = time.monotonic()
    result = await executor.execute(
        ExecutionRequest(command=["sh", "-c", "sleep 30 & sleep 30"], timeout=0.5)
    )
    assert result.status is Status.TIMED_OUT
    assert time.monotonic() - started < 3


async def test_a_signal_death_is_named(executor: ProcessExecutor) -> None:
    result = await executor.execute(ExecutionRequest(command=["sh", "-c", "kill -KILL $$"]))
    assert (result.status, result.exit_code) == (Status.FAILED, -9)
    assert result.error == "killed by signal SIGKILL"


async def test_its_messages_do_not_promise_more_than_it_does(executor: ProcessExecutor) -> None:
    result = await executor.execute(ExecutionRequest(command=["sleep", "30"], timeout=0.2))
    assert result.error and "process group" in result.error
    assert "whole process tree" not in result.error


async def test_a_deadline_moves_later_and_earlier(executor: ProcessExecutor) -> None:
    extended = asyncio.create_task(
        executor.execute(ExecutionRequest(id="later", command=["sleep", "1.5"], timeout=0.5))
    )
    await _until_running(executor, "later")
    await executor.set_timeout("later", 30)
    assert (await extended).status is Status.SUCCEEDED  # outlived its first deadline

    started = time.monotonic()
    shortened = asyncio.create_task(
        executor.execute(ExecutionRequest(id="sooner", command=["sleep", "30"], timeout=60))
    )
    await _until_running(executor, "sooner")
    await executor.set_timeout("sooner", 0.2)
    result = await shortened
    assert result.status is Status.TIMED_OUT and time.monotonic() - started < 10
    # A finished execution is returned unchanged.
    assert (await executor.set_timeout("sooner", 5)).status is Status.TIMED_OUT


async def _until_running(executor: ProcessExecutor, execution_id: str) -> None:
    for _ in range(500):
        with contextlib.suppress(ExecutionNotFound):
            if (await executor.get_status(execution_id)).status is Status.RUNNING:
                return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{execution_id} never ran")


async def test_an_egress_policy_is_refused_not_ignored(executor: ProcessExecutor) -> None:
    rules = NetworkPolicy.model_validate({"rules": [{"domain": "pypi.org"}]})
    with pytest.raises(InvalidRequest, match="cannot enforce an egress policy"):
        await executor.execute(ExecutionRequest(command=["true"], network=rules))
