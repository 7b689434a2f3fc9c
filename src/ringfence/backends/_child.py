"""A child process watched by the event loop through a pidfd, its output through a pipe.

Leaner than ``asyncio.create_subprocess_exec`` (no watcher thread per child, no stream
transport): sandbox start-up latency is a product goal, and the signals go through the pidfd,
so they can never hit a recycled pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence

__all__ = ["Child"]

_CHUNK = 64 * 1024


class Child:
    """A running child whose stdout and stderr share one pipe, read by ``pump``."""

    def __init__(self, popen: subprocess.Popen[bytes], output: int) -> None:
        self._popen = popen
        self._output = output
        self._pidfd = os.pidfd_open(popen.pid)
        self._exited: asyncio.Future[int] | None = None

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        pass_fds: Sequence[int] = (),
        cwd: str = "/",
        start_new_session: bool = False,
    ) -> Child:
        """Start ``argv`` with stdin from /dev/null; every other fd of ours stays closed.

        Raises:
            OSError: the program cannot be started.
        """
        read_end, write_end = os.pipe()
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                pass_fds=tuple(pass_fds),
                env=dict(env),
                cwd=cwd,
                start_new_session=start_new_session,
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        return cls(popen, read_end)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status, or minus the signal number that killed it; None while running."""
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait for the child to exit and reap it."""
        if self._popen.returncode is not None:
            return self._popen.returncode
        if self._exited is None:
            loop = asyncio.get_running_loop()
            self._exited = loop.create_future()
            loop.add_reader(self._pidfd, self._on_exit)
        return await asyncio.shield(self._exited)

    def _on_exit(self) -> None:
        code = self._popen.poll()
        if code is None or self._exited is None:
            return
        asyncio.get_running_loop().remove_reader(self._pidfd)
        if not self._exited.done():
            self._exited.set_result(code)

    async def pump(self, sink: Callable[[bytes], None]) -> None:
        """Pass output to ``sink`` as it comes, until every writer has closed the pipe."""
        loop = asyncio.get_running_loop()
        eof: asyncio.Future[None] = loop.create_future()
        fd = self._output

        def readable() -> None:
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            if chunk:
                sink(chunk)
            elif not eof.done():
                eof.set_result(None)

        os.set_blocking(fd, False)
        loop.add_reader(fd, readable)
        try:
            await eof
        finally:
            loop.remove_reader(fd)

    def kill(self) -> None:
        """SIGKILL the child itself (not its descendants)."""
        if self._popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self) -> None:
        """Release the pidfd and the pipe. Call once the child has been reaped."""
        for fd in (self._pidfd, self._output):
            with contextlib.suppress(OSError):
                os.close(fd)
