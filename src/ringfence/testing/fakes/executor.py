"""``FakeExecutor``: an ``Executor`` that runs no process, for tests of logic.

Its commands are the programs of ``shell`` (``echo``, ``sleep``, ``exit N`` in ``sh -c``,
...) run as coroutines on the event loop. Everything around the command is the real
supervision every subprocess backend shares (``SupervisingExecutor``): ids, the duplicate
rule, deadlines that move, cancel, bounded logs, callbacks, retention. So statuses, timeouts,
cancels and truncated output behave as on ``process`` or ``local``, in microseconds instead
of milliseconds, and the conformance check (``backend_checks``) holds it to that.

It isolates nothing, because nothing runs: a test on it proves the logic above the executor,
never a claim about sandboxes. Those need the real backends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from ringfence.backends.supervisor import Launched, SupervisingExecutor
from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ExecutionRequest, ResourceLimits
from ringfence.testing.fakes.shell import FakeProcess, Program, run_program

__all__ = ["FAKE_HOME", "FakeExecutor"]

FAKE_HOME = "/home/user"  # the HOME and default cwd its commands see (nothing is there)
_SIGKILL = 9


class FakeExecutor(SupervisingExecutor):
    """Runs each request's argv as a fake program (see ``ringfence.testing.fakes.shell``).

    ``programs`` adds programs by name (winning over the built-in ones), for a test that
    needs a command to behave some way: block until an event, print what it was given.
    ``requests`` lists every request that was started, in order, for tests to look at.
    """

    name = "fake"

    def __init__(
        self,
        config: Config | None = None,
        *,
        programs: Mapping[str, Program] | None = None,
        name: str = "fake",
    ) -> None:
        """``name``: the backend its results and placements report; a test of logic that
        depends on the backend's name (a risk policy's context) may pass ``local``."""
        super().__init__(config or Config())
        self.name = name
        self._programs = dict(programs or {})
        self.requests: list[ExecutionRequest] = []

    async def _launch(
        self, request: ExecutionRequest, limits: ResourceLimits, pass_fds: Sequence[int]
    ) -> Launched:
        """Refuses nothing of the request (limits, mounts, images and network are recorded
        in ``requests``, not applied); only descriptors cannot be passed to a coroutine."""
        if pass_fds:
            raise InvalidRequest("the fake executor cannot pass descriptors (it runs no process)")
        self.requests.append(request)
        env = {"PATH": "/usr/bin:/bin", "HOME": FAKE_HOME, **request.env}
        return _FakeLaunched(
            FakeProcess(list(request.argv), env, request.cwd or FAKE_HOME, programs=self._programs)
        )


class _FakeChild:
    """The fake program as a task; quacks like ``_child.Child`` for the supervisor."""

    def __init__(self, process: FakeProcess) -> None:
        self._pending: list[bytes] = []
        self._sink: Callable[[bytes], None] | None = None
        self._name = process.argv[0]
        process.write = self._write
        self._task = asyncio.create_task(run_program(process))
        self.returncode: int | None = None

    def _write(self, data: bytes) -> None:
        if not data:
            return
        if self._sink is None:
            self._pending.append(data)
        else:
            self._sink(data)

    async def wait(self) -> int:
        if self.returncode is None:
            await asyncio.wait({self._task})
            if self._task.cancelled():
                self.returncode = -_SIGKILL
            elif (error := self._task.exception()) is not None:  # a test's program is broken
                self._write(f"fake: {self._name} raised {error!r}\n".encode())
                self.returncode = 1
            else:
                self.returncode = self._task.result()
        return self.returncode

    async def pump(self, sink: Callable[[bytes], None]) -> None:
        for data in self._pending:
            sink(data)
        self._pending.clear()
        self._sink = sink
        await asyncio.wait({self._task})  # the output ends with the program

    def kill(self) -> None:
        self._task.cancel()

    def close(self) -> None:
        self._task.cancel()


class _FakeLaunched:
    name: str
    killed = "its fake program was cancelled"

    def __init__(self, process: FakeProcess) -> None:
        self.child = _FakeChild(process)
        self.name = f"fake-{id(self.child):x}"

    async def kill(self) -> None:
        self.child.kill()

    async def release(self) -> str | None:
        self.child.kill()
        return None

    def setup_error(self, exit_code: int, head: str) -> str | None:
        return None
