"""The checks can fail: each broken implementation here fails the check of what it breaks
(and would pass the others)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ringfence.backends import Executor, LaunchSpec, SandboxRuntime
from ringfence.errors import ExecutionNotFound
from ringfence.models import ExecutionRequest, ExecutionResult, Status
from ringfence.testing import backend_checks as checks
from ringfence.testing.backend_checks import checked_config
from ringfence.testing.fakes import FakeExecutor, FakeSandboxRuntime


class _ForgetsFinished(FakeExecutor):
    async def get_status(self, execution_id: str) -> ExecutionResult:
        result = await super().get_status(execution_id)
        if result.status.is_terminal:
            raise ExecutionNotFound(execution_id)
        return result


class _CancelDoesNotWait(FakeExecutor):
    async def cancel(self, execution_id: str) -> ExecutionResult:
        return await self.get_status(execution_id)


class _CallsTimeoutsFailures(FakeExecutor):
    async def execute(self, request: ExecutionRequest, **kwargs: object) -> ExecutionResult:
        result = await super().execute(request, **kwargs)  # type: ignore[arg-type]
        if result.status is Status.TIMED_OUT:
            return result.model_copy(update={"status": Status.FAILED})
        return result


class _RunsAnIdTwice(FakeExecutor):
    async def execute(self, request: ExecutionRequest, **kwargs: object) -> ExecutionResult:
        fresh = request.model_copy(update={"id": f"{request.id}-{len(self.requests)}"})
        return await super().execute(fresh, **kwargs)  # type: ignore[arg-type]


BROKEN_EXECUTORS: list[tuple[Callable[[], Executor], checks.ExecutorCheck]] = [
    (
        lambda: _ForgetsFinished(checked_config()),
        checks.a_finished_result_is_kept_and_cancel_leaves_it,
    ),
    (
        lambda: _CancelDoesNotWait(checked_config()),
        checks.a_running_execution_shows_running_then_cancel_ends_it,
    ),
    (lambda: _CallsTimeoutsFailures(checked_config()), checks.the_deadline_times_it_out),
    (lambda: _RunsAnIdTwice(checked_config()), checks.an_id_runs_once),
    (
        lambda: FakeExecutor(checked_config(max_log_bytes=1 << 20)),
        checks.long_output_keeps_its_head_and_tail,
    ),
]


@pytest.mark.parametrize(
    ("broken", "check"), BROKEN_EXECUTORS, ids=[check.__name__ for _, check in BROKEN_EXECUTORS]
)
async def test_a_broken_executor_fails_its_check(
    broken: Callable[[], Executor], check: checks.ExecutorCheck
) -> None:
    executor = broken()
    try:
        with pytest.raises(AssertionError):
            await check(executor)
    finally:
        await executor.aclose()


class _KillLeavesTheDaemon:
    """A sandbox whose kill reports the end and kills nothing."""

    def __init__(self, real: object) -> None:
        self._real = real
        self.socket_path: Path = real.socket_path  # type: ignore[attr-defined]
        self.running = True

    async def set_timeout(self, seconds: float) -> None:
        await self._real.set_timeout(seconds)  # type: ignore[attr-defined]

    async def kill(self) -> ExecutionResult:
        self.running = False
        return ExecutionResult(execution_id="x", status=Status.CANCELLED)

    async def ended(self) -> ExecutionResult:
        return await self._real.ended()  # type: ignore[attr-defined, no-any-return]


class _BrokenKills(FakeSandboxRuntime):
    async def start(self, spec: LaunchSpec) -> _KillLeavesTheDaemon:  # type: ignore[override]
        return _KillLeavesTheDaemon(await super().start(spec))


async def test_a_runtime_whose_kill_leaves_the_daemon_fails_its_check() -> None:
    runtime: SandboxRuntime = _BrokenKills(checked_config())
    try:
        with pytest.raises(AssertionError, match="still answers after the kill"):
            await checks.a_sandbox_runs_commands_with_its_environment_until_killed(runtime)
    finally:
        await runtime.aclose()


async def test_check_executor_and_check_runtime_run_every_check_on_a_fresh_one() -> None:
    built: list[object] = []

    async def new_executor() -> Executor:
        built.append(FakeExecutor(checked_config()))
        return built[-1]  # type: ignore[return-value]

    async def new_runtime() -> SandboxRuntime:
        built.append(FakeSandboxRuntime(checked_config()))
        return built[-1]  # type: ignore[return-value]

    await checks.check_executor(new_executor)
    await checks.check_runtime(new_runtime)
    assert len(built) == len(checks.EXECUTOR_CHECKS) + len(checks.RUNTIME_CHECKS)
    assert len({id(b) for b in built}) == len(built)
