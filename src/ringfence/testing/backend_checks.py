"""The contracts of ``Executor`` and ``SandboxRuntime`` (``ringfence.backends``), as checks.

Each check takes a fresh implementation and raises ``AssertionError`` when it breaks the
contract; tests run them against every backend (``process``, ``local``, ``job`` on the
Kubernetes API stand-in) and the fakes, as ``store_checks`` does for stores.

Build each executor under check from ``checked_config()`` (its small log bound is what
``long_output_keeps_its_head_and_tail`` measures against). Commands are ``sh -c`` scripts
of ``echo``, ``exit``, ``sleep`` and ``seq`` only: every image and the fake know them.
The caller closes what it gave a check (``aclose``), also after the checks of ``aclose``
itself: a second ``aclose`` must change nothing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ringfence.backends import Executor, LaunchSpec, LiveSandbox, SandboxRuntime
from ringfence.config import Config
from ringfence.errors import DuplicateExecution, ExecutionNotFound, SandboxNotRunning
from ringfence.models import ExecutionRequest, ExecutionResult, ResourceLimits, Status
from ringfence.service.daemon_client import DaemonClient

__all__ = [
    "CHECK_LOG_BYTES",
    "EXECUTOR_CHECKS",
    "RUNTIME_CHECKS",
    "ExecutorCheck",
    "RuntimeCheck",
    "check_executor",
    "check_runtime",
    "checked_config",
    "frames",
    "run_in_sandbox",
]

ExecutorCheck = Callable[[Executor], Awaitable[None]]
RuntimeCheck = Callable[[SandboxRuntime], Awaitable[None]]

CHECK_LOG_BYTES = 4096
WAIT = 60.0  # a bound on every wait (a Job's Pod may take a while), never an expectation


def checked_config(**settings: Any) -> Config:
    """The configuration to build an executor or runtime under check with."""
    return Config(**{"max_log_bytes": CHECK_LOG_BYTES, **settings})


def _request(script: str, timeout: float = WAIT, **fields: Any) -> ExecutionRequest:
    return ExecutionRequest(
        id=f"check-{uuid.uuid4().hex[:12]}", command=["sh", "-c", script], timeout=timeout,
        **fields,
    )  # fmt: skip


async def _bounded(work: Awaitable[ExecutionResult]) -> ExecutionResult:
    async with asyncio.timeout(WAIT):
        return await work


class _Started:
    """An execution running in the background, and the moment it started."""

    def __init__(self, executor: Executor, request: ExecutionRequest) -> None:
        self.request = request
        self.started = asyncio.Event()
        self.task = asyncio.create_task(
            executor.execute(request, on_start=lambda _: self.started.set())
        )

    async def running(self) -> None:
        waiting = asyncio.create_task(self.started.wait())
        try:
            await asyncio.wait(
                {waiting, self.task}, timeout=WAIT, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiting.cancel()
        assert self.started.is_set(), (
            f"it never started: {self.task.result() if self.task.done() else 'no answer'}"
        )


# -- executors -------------------------------------------------------------------------------


async def a_command_succeeds_with_its_output(executor: Executor) -> None:
    request = _request("echo hello; echo world")
    output: list[bytes] = []
    starts: list[ExecutionResult] = []
    result = await _bounded(
        executor.execute(request, on_output=output.append, on_start=starts.append)
    )
    assert result.status is Status.SUCCEEDED, result
    assert (result.exit_code, result.error) == (0, None), result
    assert "hello\nworld\n" in result.logs and not result.logs_truncated
    assert b"hello\nworld\n" in b"".join(output), "output is passed on as it comes"
    assert result.execution_id == request.id and result.backend == executor.name
    assert result.started_at is not None and result.finished_at is not None
    assert result.started_at <= result.finished_at
    assert [s.status for s in starts] == [Status.RUNNING], "on_start: once, when running"
    assert starts[0].execution_id == request.id


async def a_failure_keeps_its_exit_code_and_output(executor: Executor) -> None:
    result = await _bounded(executor.execute(_request("echo broken; exit 3")))
    assert (result.status, result.exit_code) == (Status.FAILED, 3), result
    assert "broken" in result.logs


async def the_deadline_times_it_out(executor: Executor) -> None:
    result = await _bounded(executor.execute(_request("echo started; sleep 600", timeout=1)))
    assert result.status is Status.TIMED_OUT, result
    assert result.exit_code is None and result.error


async def a_running_execution_shows_running_then_cancel_ends_it(executor: Executor) -> None:
    started = _Started(executor, _request("echo started; sleep 600"))
    await started.running()
    assert (await executor.get_status(started.request.id)).status is Status.RUNNING
    cancelled = await executor.cancel(started.request.id)
    assert cancelled.status is Status.CANCELLED and cancelled.exit_code is None, cancelled
    assert (await _bounded(started.task)).status is Status.CANCELLED
    again = await executor.cancel(started.request.id)
    assert again.status is Status.CANCELLED, "cancelling an ended execution changes nothing"


async def a_finished_result_is_kept_and_cancel_leaves_it(executor: Executor) -> None:
    request = _request("echo kept; exit 4")
    result = await _bounded(executor.execute(request))
    try:
        kept = await executor.get_status(request.id)
    except ExecutionNotFound:
        raise AssertionError("a finished result was forgotten at once") from None
    assert (kept.status, kept.exit_code) == (result.status, result.exit_code) == (
        Status.FAILED, 4,
    )  # fmt: skip
    assert "kept" in kept.logs
    after = await executor.cancel(request.id)
    assert (after.status, after.exit_code) == (Status.FAILED, 4), "cancel changed a result"


async def an_id_runs_once(executor: Executor) -> None:
    request = _request("echo once")
    await _bounded(executor.execute(request))
    try:
        await executor.execute(request)
    except DuplicateExecution:
        return
    raise AssertionError("a retained execution's id was run again")


async def unknown_ids_are_not_found(executor: Executor) -> None:
    for call in (executor.get_status, executor.cancel):
        try:
            await call("check-never-ran")
        except ExecutionNotFound:
            continue
        raise AssertionError(f"{call.__name__} of an unknown id did not raise ExecutionNotFound")


async def long_output_keeps_its_head_and_tail(executor: Executor) -> None:
    result = await _bounded(executor.execute(_request("seq 1 20000; echo END")))
    assert result.status is Status.SUCCEEDED, result
    assert result.logs_truncated, "about 100 kB of output, kept in full"
    assert len(result.logs.encode()) <= CHECK_LOG_BYTES + 100, len(result.logs.encode())
    assert result.logs.startswith("1\n2\n3\n"), "the head is kept"
    assert result.logs.rstrip().endswith("20000\nEND"), "the tail is kept"


async def a_callback_that_raises_is_not_called_again(executor: Executor) -> None:
    calls: list[bytes] = []

    def broken(chunk: bytes) -> None:
        calls.append(chunk)
        raise RuntimeError("a broken caller")

    result = await _bounded(executor.execute(_request("seq 1 2000"), on_output=broken))
    assert result.status is Status.SUCCEEDED, result
    assert len(calls) == 1 and result.logs.rstrip().endswith("2000")


async def aclose_cancels_what_runs(executor: Executor) -> None:
    started = _Started(executor, _request("sleep 600"))
    await started.running()
    async with asyncio.timeout(WAIT):
        await executor.aclose()
    assert started.task.done(), "aclose returned before the execution ended"
    assert started.task.result().status is Status.CANCELLED


EXECUTOR_CHECKS: list[ExecutorCheck] = [
    a_command_succeeds_with_its_output,
    a_failure_keeps_its_exit_code_and_output,
    the_deadline_times_it_out,
    a_running_execution_shows_running_then_cancel_ends_it,
    a_finished_result_is_kept_and_cancel_leaves_it,
    an_id_runs_once,
    unknown_ids_are_not_found,
    long_output_keeps_its_head_and_tail,
    a_callback_that_raises_is_not_called_again,
    aclose_cancels_what_runs,
]


async def check_executor(new_executor: Callable[[], Awaitable[Executor]]) -> None:
    """Run every executor check, each on a fresh executor (closed after it)."""
    for check in EXECUTOR_CHECKS:
        executor = await new_executor()
        try:
            await check(executor)
        finally:
            await executor.aclose()


# -- sandbox runtimes ------------------------------------------------------------------------


def _spec(timeout: float = 120, **env: str) -> LaunchSpec:
    return LaunchSpec(image="host", env=env, limits=ResourceLimits(), timeout=timeout)


async def run_in_sandbox(
    sandbox: LiveSandbox, *argv: str, user: str | None = None
) -> tuple[str, int | None]:
    """Run ``argv`` through the sandbox's daemon (``process.Process/Start``), as ``user``
    (the daemon's default when None); its output and exit status."""
    client = DaemonClient("check", sandbox.socket_path)
    try:
        await client.health(WAIT)
        payload = json.dumps({"process": {"cmd": argv[0], "args": list(argv[1:])}}).encode()
        response = await client.send(
            "POST", "/process.Process/Start",
            params={} if user is None else {"username": user},
            headers={"content-type": "application/connect+json"},
            content=struct.pack(">BI", 0, len(payload)) + payload,
        )  # fmt: skip
        assert response.status_code == 200, await response.aread()
        output, exit_code = "", None
        async for flags, message in frames(response.aiter_raw()):
            event = message.get("event") or {}
            if flags & 2:
                assert not message.get("error"), message
            elif "data" in event:
                output += base64.b64decode(event["data"].get("stdout", "")).decode()
            elif "end" in event:
                exit_code = event["end"].get("exitCode", 0)
        return output, exit_code
    finally:
        await client.aclose()


async def frames(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """The ``(flags, message)`` of each Connect envelope in a streamed answer."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        while len(buffer) >= 5:
            flags, size = struct.unpack(">BI", buffer[:5])
            if len(buffer) < 5 + size:
                break
            yield flags, json.loads(buffer[5 : 5 + size])
            buffer = buffer[5 + size :]


async def _refused(sandbox: LiveSandbox) -> bool:
    client = DaemonClient("check", sandbox.socket_path)
    try:
        await client.health(5)
    except SandboxNotRunning:
        return True
    finally:
        await client.aclose()
    return False


async def a_sandbox_runs_commands_with_its_environment_until_killed(
    runtime: SandboxRuntime,
) -> None:
    sandbox = await runtime.start(_spec(RF_CHECK="from the spec"))
    assert sandbox.running
    output, exit_code = await run_in_sandbox(sandbox, "sh", "-c", 'echo "$RF_CHECK"; exit 5')
    assert (output, exit_code) == ("from the spec\n", 5), (output, exit_code)
    async with asyncio.timeout(WAIT):
        ended = await sandbox.kill()
    assert ended.status is Status.CANCELLED, ended
    assert not sandbox.running
    assert await _refused(sandbox), "its daemon still answers after the kill"
    assert (await sandbox.kill()).status is Status.CANCELLED, "a second kill changes nothing"


async def a_sandbox_expires_at_its_timeout_which_can_move(runtime: SandboxRuntime) -> None:
    sandbox = await runtime.start(_spec(timeout=600))
    await sandbox.set_timeout(1)
    async with asyncio.timeout(WAIT):
        ended = await sandbox.ended()
    assert ended.status is Status.TIMED_OUT, ended
    assert not sandbox.running
    assert (await sandbox.kill()).status is Status.TIMED_OUT, "a kill after the end"


async def aclose_kills_every_sandbox(runtime: SandboxRuntime) -> None:
    sandboxes = [await runtime.start(_spec()) for _ in range(2)]
    async with asyncio.timeout(WAIT):
        await runtime.aclose()
    for sandbox in sandboxes:
        assert not sandbox.running, "aclose returned with a sandbox running"
        assert (await sandbox.ended()).status is Status.CANCELLED


RUNTIME_CHECKS: list[RuntimeCheck] = [
    a_sandbox_runs_commands_with_its_environment_until_killed,
    a_sandbox_expires_at_its_timeout_which_can_move,
    aclose_kills_every_sandbox,
]


async def check_runtime(new_runtime: Callable[[], Awaitable[SandboxRuntime]]) -> None:
    """Run every runtime check, each on a fresh runtime (closed after it)."""
    for check in RUNTIME_CHECKS:
        runtime = await new_runtime()
        try:
            await check(runtime)
        finally:
            await runtime.aclose()
