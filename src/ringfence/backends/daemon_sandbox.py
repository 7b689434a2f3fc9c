"""An interactive sandbox that is one long execution of the sandbox daemon.

The local backend's sandboxes are this (``local.interactive``), and so are the fake
runtime's (``ringfence.testing.fakes``): a ``SupervisingExecutor`` runs the daemon with the
listening socket passed in, and the execution's deadline, cancel and end are the sandbox's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

from ringfence.backends._interactive import Stateless, Unmeasured
from ringfence.backends._supervisor import SupervisingExecutor
from ringfence.errors import ExecutionNotFound, SandboxError
from ringfence.models import ExecutionRequest, ExecutionResult

__all__ = ["DaemonSandbox", "listen", "start_daemon_sandbox"]

_BACKLOG = 256


class DaemonSandbox(Unmeasured, Stateless):
    """A running interactive sandbox: where its daemon listens, and its lifecycle. The
    runtimes that know its processes and files wrap it to measure it (``usage``)."""

    unmeasured = "the daemon's execution alone names no cgroup or files to read"

    def __init__(
        self,
        executor: SupervisingExecutor,
        run_id: str,
        socket_path: Path,
        task: asyncio.Task[ExecutionResult],
    ) -> None:
        self.socket_path = socket_path
        self._executor = executor
        self._run_id = run_id  # the daemon's execution on ``executor``
        self._task = task

    async def set_timeout(self, seconds: float) -> None:
        """Kill the sandbox ``seconds`` from now (instead of at its earlier deadline)."""
        await self._executor.set_timeout(self._run_id, seconds)

    async def kill(self) -> ExecutionResult:
        """Kill every process of the sandbox and wait until nothing of it remains."""
        with contextlib.suppress(ExecutionNotFound):  # already forgotten: it has ended
            await self._executor.cancel(self._run_id)
        return await self.ended()

    async def ended(self) -> ExecutionResult:
        """Wait for the end (kill, deadline, or the daemon's own exit); nothing remains."""
        return await asyncio.shield(self._task)

    @property
    def running(self) -> bool:
        return not self._task.done()


def listen(path: Path) -> socket.socket:
    """A unix socket listening at ``path``, for the daemon to inherit.

    Raises:
        SandboxError: it cannot be created.
    """
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(_BACKLOG)
    except OSError as exc:
        listener.close()
        raise SandboxError(f"cannot create the sandbox's socket {path}: {exc.strerror}") from exc
    return listener


async def start_daemon_sandbox(
    executor: SupervisingExecutor,
    request: ExecutionRequest,
    listener: socket.socket,
    socket_path: Path,
    start_seconds: float,
) -> DaemonSandbox:
    """Run ``request`` (the daemon, told ``--listen-fd`` of ``listener``) on ``executor``;
    return once it has started. ``listener`` is closed here (the daemon has its copy, so a
    dead daemon refuses connects) and ``socket_path`` removed when the execution ends.

    Raises:
        SandboxError: it could not be set up, or did not start within ``start_seconds``.
        TooManyRequests: the host has no room for it; nothing started.
    """
    started = asyncio.Event()
    task = asyncio.create_task(
        executor.execute(request, on_start=lambda _: started.set(), pass_fds=(listener.fileno(),))
    )
    task.add_done_callback(lambda _: socket_path.unlink(missing_ok=True))
    try:
        await _first(started, task, start_seconds)
    finally:
        listener.close()
    if task.done():
        result = task.result()
        raise SandboxError(result.error or f"the sandbox daemon exited: {result.logs[:500]}")
    return DaemonSandbox(executor, request.id, socket_path, task)


async def _first(event: asyncio.Event, task: asyncio.Task[ExecutionResult], timeout: float) -> None:
    """Wait until ``event`` is set or ``task`` ends, whichever is first."""
    other = asyncio.create_task(event.wait())
    try:
        done, _ = await asyncio.wait(
            {other, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    except BaseException:  # our caller gave up: the sandbox must not outlive that
        task.cancel()
        raise
    finally:
        other.cancel()
    if not done:
        task.cancel()
        raise SandboxError(f"the sandbox did not start within {timeout:g} s")
