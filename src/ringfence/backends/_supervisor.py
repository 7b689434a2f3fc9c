"""What every subprocess-based backend shares: ids, deadlines, cancel, output, results.

A backend supplies ``_launch``, which starts the command in its sandbox and returns a
``Launched`` handle; this module supervises it the same way for every backend.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

from ringfence.backends._child import Child
from ringfence.backends._output import BoundedLog
from ringfence.backends._protocol import OutputCallback, StartCallback
from ringfence.backends._runs import Run, RunTable
from ringfence.config import Config
from ringfence.errors import RingfenceError
from ringfence.models import ExecutionRequest, ExecutionResult, ResourceLimits, Status

__all__ = ["Launched", "SupervisingExecutor"]

log = logging.getLogger(__name__)

# After the command's process exits, output still buffered in the pipe is read for at most
# this long: a descendant that escaped the sandbox's kill (only possible on the process
# backend) must not hold the execution open.
_DRAIN_GRACE_SECONDS = 1.0
# How long a killed sandbox may take to be reaped before the execution reports an error.
_REAP_SECONDS = 10.0


class Launched(Protocol):
    """A command started in its sandbox; its output carries stdout and stderr interleaved."""

    child: Child
    name: str
    killed: str  # what a kill reaches, in words: "the whole process tree was killed"

    async def kill(self) -> None:
        """Kill every process of the sandbox, now."""
        ...

    async def release(self) -> str | None:
        """Kill what is left and free every resource; return a cause of death worth
        reporting ("out of memory") or None. Must be safe to call once after any outcome."""
        ...

    def setup_error(self, exit_code: int, head: str) -> str | None:
        """If the sandbox failed before the command could start, describe why; else None.

        Only what the command cannot fake may decide this: not its output alone."""
        ...


class SupervisingExecutor(ABC):
    """An ``Executor`` whose backend-specific part is starting one sandboxed process."""

    name: str = "abstract"

    def __init__(self, config: Config) -> None:
        self.config = config
        self._runs = RunTable(
            ttl=config.ttl_seconds_after_finished, max_finished=config.max_retained_results
        )

    def check(self, request: ExecutionRequest) -> None:  # noqa: B027 (optional hook)
        """Reject a request this backend cannot honour (raise ``InvalidRequest``)."""

    @abstractmethod
    async def _launch(self, request: ExecutionRequest, limits: ResourceLimits) -> Launched:
        """Start ``request`` in a fresh sandbox. Raise ``RingfenceError`` or ``OSError``."""

    async def execute(
        self,
        request: ExecutionRequest,
        *,
        on_output: OutputCallback | None = None,
        on_start: StartCallback | None = None,
    ) -> ExecutionResult:
        self.check(request)
        run = Run(id=request.id, log=BoundedLog(self.config.max_log_bytes), backend=self.name)
        self._runs.add(run)
        try:
            await self._supervise(run, request, on_output, on_start)
        finally:
            if not run.status.is_terminal:  # we were cancelled from outside
                run.error = run.error or "the executor stopped supervising this execution"
                run.move_to(Status.CANCELLED)
            self._runs.finished(run)
            run.done.set()
        return run.result()

    async def get_status(self, execution_id: str) -> ExecutionResult:
        return self._runs.get(execution_id).result()

    async def cancel(self, execution_id: str) -> ExecutionResult:
        run = self._runs.get(execution_id)
        if not run.status.is_terminal:
            run.cancel_requested.set()
            await run.done.wait()
        return run.result()

    async def aclose(self) -> None:
        runs = self._runs.running()
        for run in runs:
            run.cancel_requested.set()
        for run in runs:
            await run.done.wait()

    async def _supervise(
        self,
        run: Run,
        request: ExecutionRequest,
        on_output: OutputCallback | None,
        on_start: StartCallback | None,
    ) -> None:
        limits = request.limits.merged_over(self.config.default_limits)
        timeout = request.timeout or self.config.default_timeout
        try:
            sandbox = await self._launch(request, limits)
        except (RingfenceError, OSError) as exc:
            run.error = f"could not start the sandbox: {exc}"
            run.move_to(Status.FAILED)
            return
        run.job_name = sandbox.name
        run.move_to(Status.RUNNING)
        if on_start is not None:
            try:
                on_start(run.result())
            except Exception:  # boundary: a caller's callback must not break supervision
                log.exception("start callback failed")
        reader = asyncio.create_task(sandbox.child.pump(_sink(run.log, on_output)))
        outcome = Status.CANCELLED
        try:
            outcome = await _wait_for_end(sandbox, run.cancel_requested, timeout)
            if outcome is not Status.SUCCEEDED:
                await sandbox.kill()
            await asyncio.wait_for(sandbox.child.wait(), _REAP_SECONDS)
            await _drain(reader)
        finally:
            # Runs even when we are cancelled from outside: nothing of the sandbox may remain.
            reader.cancel()
            cause = await asyncio.shield(sandbox.release())
            sandbox.child.close()
        self._conclude(run, outcome, sandbox, cause, timeout)

    def _conclude(
        self, run: Run, outcome: Status, sandbox: Launched, cause: str | None, timeout: float
    ) -> None:
        if outcome is Status.TIMED_OUT:
            run.error = f"timed out after {timeout:g} s; {sandbox.killed}"
            run.move_to(Status.TIMED_OUT)
            return
        if outcome is Status.CANCELLED:
            run.error = f"cancelled; {sandbox.killed}"
            run.move_to(Status.CANCELLED)
            return
        code = sandbox.child.returncode
        assert code is not None
        run.exit_code = code
        setup_error = sandbox.setup_error(code, run.log.text()[:4096])
        if cause is not None:
            run.error = cause
        elif setup_error is not None:
            run.exit_code = None
            run.error = setup_error
        elif code < 0:  # only a direct child's status says so; 128+N may be a plain exit
            run.error = f"killed by signal {_signal_name(-code)}"
        run.move_to(Status.SUCCEEDED if code == 0 and run.error is None else Status.FAILED)


async def _wait_for_end(sandbox: Launched, cancel: asyncio.Event, timeout: float) -> Status:
    """SUCCEEDED here means only "the process exited by itself"."""
    exited = asyncio.create_task(sandbox.child.wait())
    cancelled = asyncio.create_task(cancel.wait())
    try:
        done, _ = await asyncio.wait(
            {exited, cancelled}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        exited.cancel()
        cancelled.cancel()
    if exited in done:
        return Status.SUCCEEDED
    return Status.CANCELLED if cancelled in done else Status.TIMED_OUT


def _sink(log_: BoundedLog, on_output: OutputCallback | None) -> Callable[[bytes], None]:
    callback = on_output

    def write(chunk: bytes) -> None:
        nonlocal callback
        log_.write(chunk)
        if callback is not None:
            try:
                callback(chunk)
            except Exception:  # boundary: a caller's callback must not break supervision
                log.exception("output callback failed; no more output will be passed to it")
                callback = None

    return write


async def _drain(reader: asyncio.Task[None]) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(reader), _DRAIN_GRACE_SECONDS)
    except TimeoutError:
        reader.cancel()


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
