"""The Executor protocol: one-shot executions, each in a fresh sandbox."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ringfence.models import ExecutionRequest, ExecutionResult

__all__ = ["Executor", "OutputCallback", "StartCallback"]

OutputCallback = Callable[[bytes], None]
"""Called with each chunk of the command's output (stdout and stderr, in order) as it comes."""

StartCallback = Callable[[ExecutionResult], None]
"""Called once, with the ``running`` result, when the command has been started."""


class Executor(Protocol):
    """Runs ``ExecutionRequest``s once each, in a fresh sandbox destroyed at the end.

    Callers are the service layer, the CLI and tests. The executor owns every process,
    cgroup and mount it creates: when ``execute`` returns (or is itself cancelled), nothing of
    the sandbox remains. ``aclose`` cancels what still runs. Errors that may escape:
    ``InvalidRequest`` (the request cannot be honoured by this backend), ``DuplicateExecution``,
    ``ExecutionNotFound``, ``TooManyRequests`` (the host has no room for the sandbox: nothing
    ran); failures of the sandbox itself are reported in the result's ``status`` and
    ``error``, not raised.

    An executor knows one id per execution, the request's ``id``, which its methods call
    ``execution_id``. Under the service layer that is the *run id* the service chose, never
    the tenant's execution id (``ExecutionService`` maps one to the other); the CLI and the
    Python API run requests under their own ids.
    """

    name: str

    def check(self, request: ExecutionRequest) -> None:
        """Refuse, before anything runs, a request this backend cannot honour.

        Cheap and without side effects; ``execute`` calls it too.

        Raises:
            InvalidRequest: for example an unknown image or a missing mount source.
            TooManyRequests: the host has no room for another sandbox now (for example
                ``SandboxUidsExhausted``).
        """
        ...

    async def execute(
        self,
        request: ExecutionRequest,
        *,
        on_output: OutputCallback | None = None,
        on_start: StartCallback | None = None,
    ) -> ExecutionResult:
        """Run the request and wait for a terminal status.

        Callbacks must not block; an exception from one is logged and it is not called again.

        Raises:
            DuplicateExecution: an execution with this id is running or retained.
            InvalidRequest: this backend cannot honour the request.
            TooManyRequests: the host had no room to start it (nothing ran).
        """
        ...

    async def get_status(self, execution_id: str) -> ExecutionResult:
        """The current state of a running or retained execution.

        Raises:
            ExecutionNotFound: no such execution, or its result was already forgotten.
        """
        ...

    async def cancel(self, execution_id: str) -> ExecutionResult:
        """Kill the whole process tree; the execution ends ``cancelled``.

        Cancelling a finished execution changes nothing and returns its result.

        Raises:
            ExecutionNotFound: no such execution.
        """
        ...

    async def aclose(self) -> None:
        """Cancel every running execution and wait until they are cleaned up."""
        ...
