"""The table of executions an executor knows: running ones and finished ones kept a while."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ringfence.backends._output import BoundedLog
from ringfence.errors import DuplicateExecution, ExecutionNotFound
from ringfence.models import ExecutionResult, Status, advance

__all__ = ["Run", "RunTable"]


@dataclass
class Run:
    """The mutable state of one execution while the executor supervises it."""

    id: str
    log: BoundedLog
    backend: str
    status: Status = Status.PENDING
    job_name: str | None = None
    exit_code: int | None = None
    error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The loop time the deadline falls at, once running; moving it sets deadline_moved.
    deadline: float | None = None
    deadline_moved: asyncio.Event = field(default_factory=asyncio.Event)

    def move_deadline(self, seconds_from_now: float) -> None:
        self.deadline = asyncio.get_running_loop().time() + seconds_from_now
        self.deadline_moved.set()

    def move_to(self, status: Status) -> None:
        self.status = advance(self.status, status)
        now = datetime.now(UTC)
        if status is Status.RUNNING:
            self.started_at = now
        if status.is_terminal:
            self.finished_at = now

    def result(self) -> ExecutionResult:
        return ExecutionResult(
            execution_id=self.id,
            status=self.status,
            exit_code=self.exit_code,
            logs=self.log.text(),
            logs_truncated=self.log.truncated,
            job_name=self.job_name,
            backend=self.backend,
            started_at=self.started_at,
            finished_at=self.finished_at,
            error=self.error,
        )


class RunTable:
    """Maps ids to runs; forgets finished runs after ``ttl`` seconds or beyond ``max_finished``."""

    def __init__(self, *, ttl: float, max_finished: int) -> None:
        self._ttl = ttl
        self._max_finished = max_finished
        self._runs: dict[str, Run] = {}
        self._finished: OrderedDict[str, float] = OrderedDict()  # id -> finish time, in order

    def add(self, run: Run) -> None:
        """Raises ``DuplicateExecution`` if the id is running or retained."""
        self._prune()
        if run.id in self._runs:
            raise DuplicateExecution(f"an execution with id {run.id!r} already exists")
        self._runs[run.id] = run

    def finished(self, run: Run) -> None:
        """Record that ``run`` reached a terminal status; its retention time starts now."""
        self._finished[run.id] = time.monotonic()
        self._prune()

    def get(self, execution_id: str) -> Run:
        """Raises ``ExecutionNotFound`` for an unknown or forgotten id."""
        self._prune()
        try:
            return self._runs[execution_id]
        except KeyError:
            raise ExecutionNotFound(f"no execution with id {execution_id!r}") from None

    def running(self) -> list[Run]:
        return [run for run in self._runs.values() if not run.status.is_terminal]

    def _prune(self) -> None:
        horizon = time.monotonic() - self._ttl
        while self._finished:
            execution_id, finished_at = next(iter(self._finished.items()))
            if finished_at > horizon and len(self._finished) <= self._max_finished:
                break
            del self._finished[execution_id]
            del self._runs[execution_id]
