"""What every subprocess-based backend shares: ids, deadlines, cancel, output, results.

A backend supplies ``_launch``, which starts the command in its sandbox and returns a
``Launched`` handle; this module supervises it the same way for every backend.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from ringfence.backends._output import BoundedLog
from ringfence.backends._protocol import OutputCallback, StartCallback
from ringfence.backends._runs import Run, RunTable
from ringfence.config import Config
from ringfence.errors import RingfenceError, TooManyRequests
from ringfence.models import ExecutionRequest, ExecutionResult, ResourceLimits, Status

__all__ = ["Launched", "SupervisedProcess", "SupervisingExecutor"]

log = logging.getLogger(__name__)

# After the command's process exits, output still buffered in the pipe is read for at most
# this long: a descendant that escaped the sandbox's kill (only possible on the process
# backend) must not hold the execution open.
_DRAIN_GRACE_SECONDS = 1.0
# How long a killed sandbox may take to be reaped before the execution reports an error.
_REAP_SECONDS = 10.0


class SupervisedProcess(Protocol):
    """The command's process as the supervisor sees it (``_child.Child`` for every real
    backend; the in-memory stand-in of ``ringfence.testing.fakes`` for tests of logic)."""

    @property
    def returncode(self) -> int | None:
        """The exit status, or minus the signal number that killed it; None while running."""
        ...

    async def wait(self) -> int:
        """Wait for the process to exit (and reap it)."""
        ...

    async def pump(self, sink: Callable[[bytes], None]) -> None:
        """Pass output to ``sink`` as it comes, until the output ends."""
        ...

    def close(self) -> None:
        """Release what watches the process. Called once it has been reaped."""
        ...


class Launched(Protocol):
    """A command started in its sandbox; its output carries stdout and stderr interleaved."""

    name: str
    killed: str  # what a kill reaches, in words: "the whole process tree was killed"

    @property
    def child(self) -> SupervisedProcess:
        """The command's process."""
        ...

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
    async def _launch(
        self, request: ExecutionRequest, limits: ResourceLimits, pass_fds: Sequence[int]
    ) -> Launched:
        """Start ``request`` in a fresh sandbox, its command inheriting ``pass_fds`` as they
        are numbered here. Raise ``RingfenceError`` or ``OSError``; a ``TooManyRequests``
        (the host has no room) escapes ``execute`` instead of failing the execution."""

    async def execute(
        self,
        request: ExecutionRequest,
        *,
        on_output: OutputCallback | None = None,
        on_start: StartCallback | None = None,
        pass_fds: Sequence[int] = (),
    ) -> ExecutionResult:
        """See ``Executor.execute``. ``pass_fds`` are inherited by the command (an
        interactive sandbox's daemon gets its listening socket this way).

        Raises:
            TooManyRequests: the host had no room to start it (nothing ran).
        """
        self.check(request)
        run = Run(id=request.id, log=BoundedLog(self.config.max_log_bytes), backend=self.name)
        self._runs.add(run)
        try:
            await self._supervise(run, request, on_output, on_start, pass_fds)
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

    async def set_timeout(self, execution_id: str, seconds: float) -> ExecutionResult:
        """Move the deadline of a running execution to ``seconds`` from now (earlier or
        later); a finished one is returned unchanged.

        Raises:
            ExecutionNotFound: no such execution.
        """
        run = self._runs.get(execution_id)
        if not run.status.is_terminal:
            run.move_deadline(seconds)
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
        pass_fds: Sequence[int],
    ) -> None:
        limits = request.limits.merged_over(self.config.default_limits)
        timeout = request.timeout or self.config.default_timeout
        try:
            launched = await self._launch(request, limits, pass_fds)
        except TooManyRequests as exc:  # no room on this host: the caller's to answer
            run.error = f"could not start the sandbox: {exc.message}"
            run.move_to(Status.FAILED)
            raise
        except (RingfenceError, OSError) as exc:
            run.error = f"could not start the sandbox: {exc}"
            run.move_to(Status.FAILED)
            return
        run.job_name = launched.name
        run.move_deadline(timeout)
        run.move_to(Status.RUNNING)
        if on_start is not None:
            try:
                on_start(run.result())
            except Exception:  # boundary: a caller's callback must not break supervision
                log.exception("start callback failed")
        reader = asyncio.create_task(launched.child.pump(_sink(run.log, on_output)))
        outcome = Status.CANCELLED
        try:
            outcome = await _wait_for_end(launched, run)
            if outcome is not Status.SUCCEEDED:
                await launched.kill()
            await asyncio.wait_for(launched.child.wait(), _REAP_SECONDS)
            await _drain(reader)
        finally:
            # Runs even when we are cancelled from outside: nothing of the sandbox may remain.
            reader.cancel()
            cause = await asyncio.shield(launched.release())
            launched.child.close()
        self._conclude(run, outcome, launched, cause)

    def _conclude(self, run: Run, outcome: Status, launched: Launched, cause: str | None) -> None:
        if outcome is Status.TIMED_OUT:
            assert run.started_at is not None and run.finished_at is None
            ran = (datetime.now(UTC) - run.started_at).total_seconds()
            run.error = f"timed out after {ran:.3g} s; {launched.killed}"
            run.move_to(Status.TIMED_OUT)
            return
        if outcome is Status.CANCELLED:
            run.error = f"cancelled; {launched.killed}"
            run.move_to(Status.CANCELLED)
            return
        code = launched.child.returncode
        assert code is not None
        run.exit_code = code
        setup_error = launched.setup_error(code, run.log.text()[:4096])
        if cause is not None:
            run.error = cause
        elif setup_error is not None:
            run.exit_code = None
            run.error = setup_error
        elif code < 0:  # only a direct child's status says so; 128+N may be a plain exit
            run.error = f"killed by signal {_signal_name(-code)}"
        run.move_to(Status.SUCCEEDED if code == 0 and run.error is None else Status.FAILED)


async def _wait_for_end(launched: Launched, run: Run) -> Status:
    """SUCCEEDED here means only "the process exited by itself". The deadline may move."""
    loop = asyncio.get_running_loop()
    exited = asyncio.create_task(launched.child.wait())
    cancelled = asyncio.create_task(run.cancel_requested.wait())
    try:
        while True:
            assert run.deadline is not None
            run.deadline_moved.clear()
            moved = asyncio.create_task(run.deadline_moved.wait())
            try:
                done, _ = await asyncio.wait(
                    {exited, cancelled, moved},
                    timeout=max(run.deadline - loop.time(), 0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                moved.cancel()
            if exited in done:
                return Status.SUCCEEDED
            if cancelled in done:
                return Status.CANCELLED
            if moved not in done:
                return Status.TIMED_OUT
    finally:
        exited.cancel()
        cancelled.cancel()


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
