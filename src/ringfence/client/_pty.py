"""``sbx.pty``: terminals in a sandbox (a process on a pseudo-terminal of a given size).

    term = await sbx.pty.create(rows=24, cols=80, on_data=sys.stdout.buffer.write)
    await term.send_input("ls --color\\n")
    await term.resize(40, 120)
    await term.send_input("exit\\n")
    code = await term.wait()

A terminal runs the sandbox's login shell (``/bin/bash -i -l``) unless given a command; as
the sandbox's user with the limits of its commands. Its output is bytes as the terminal
wrote them (escape sequences included): to ``on_data`` as each chunk arrives, else to
iteration over the handle (``async for chunk in term``). Without ``on_data`` unread output is
held back, not buffered without end: the terminal's writes wait for the reader, as a real
terminal's do. ``connect`` adds a watcher to a running one (its output from then on).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ringfence.client._commands import check_user, end_result
from ringfence.client._errors import ProcessNotFound
from ringfence.client._link import Link, RpcStream
from ringfence.errors import InvalidRequest, SandboxError
from ringfence.sandboxd.methods import PROCESS

__all__ = ["AsyncPty", "AsyncPtyHandle", "DataCallback", "pty_start_message", "terminal_size"]

DataCallback = Callable[[bytes], object]  # may return an awaitable (an async callback)
LOGIN_SHELL = ("/bin/bash", "-i", "-l")
MAX_SIDE = 65535
_QUEUED_CHUNKS = 64  # output held for a reader that iterates; past it the terminal waits
_ENV = {"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def terminal_size(rows: int, cols: int) -> dict[str, Any]:
    """The ``PTY`` message of a size. Raises ``InvalidRequest`` outside 1..65535."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SIDE:
            raise InvalidRequest(f"{name} must be an integer from 1 to {MAX_SIDE}")
    return {"size": {"rows": rows, "cols": cols}}


def pty_start_message(
    rows: int,
    cols: int,
    *,
    cmd: Sequence[str] | None,
    envs: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
) -> dict[str, Any]:
    """The ``Start`` request of a terminal: ``cmd`` (argv; the login shell by default) on a
    pty of ``rows`` x ``cols``, with ``TERM``/``LANG``/``LC_ALL`` set unless ``envs`` sets
    them, killed after ``timeout`` seconds (None or 0: never).

    Raises:
        InvalidRequest: a bad size, an empty command, a negative timeout.
    """
    argv = [str(part) for part in (LOGIN_SHELL if cmd is None else cmd)]
    if isinstance(cmd, str) or not argv or not argv[0]:
        raise InvalidRequest("cmd is a non-empty argv list (the login shell when omitted)")
    if timeout is not None and timeout < 0:
        raise InvalidRequest("timeout must be positive (or None / 0 for no deadline)")
    process: dict[str, Any] = {"cmd": argv[0], "args": argv[1:], "envs": {**_ENV, **(envs or {})}}
    if cwd:
        process["cwd"] = cwd
    message: dict[str, Any] = {"process": process, "pty": terminal_size(rows, cols)}
    if timeout:
        message["timeoutMs"] = max(1, round(timeout * 1000))
    return message


class AsyncPty:
    """Terminals in one sandbox."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def create(
        self,
        rows: int = 24,
        cols: int = 80,
        *,
        cmd: Sequence[str] | None = None,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        on_data: DataCallback | None = None,
    ) -> AsyncPtyHandle:
        """Open a terminal of ``rows`` x ``cols`` running ``cmd`` (an argv list; the login
        shell when omitted); returns once it runs.

        Raises:
            InvalidRequest: a bad size or command, an unknown program or working directory,
                a user but "user" and "root".
            ResourceExhausted: the sandbox already runs its most terminals (32).
            SandboxNotFound, ServerUnreachable.
        """
        check_user(user)
        message = pty_start_message(rows, cols, cmd=cmd, envs=envs, cwd=cwd, timeout=timeout)
        stream = await self._link.stream(PROCESS, "Start", message, user=user)
        return await AsyncPtyHandle.started(self, stream, on_data)

    async def connect(self, pid: int, *, on_data: DataCallback | None = None) -> AsyncPtyHandle:
        """Watch a running terminal too: its output from now on (no replay) and its end.

        Raises:
            ProcessNotFound: no running process has this pid.
        """
        stream = await self._link.stream(PROCESS, "Connect", {"process": {"pid": pid}})
        return await AsyncPtyHandle.started(self, stream, on_data)

    async def send_input(self, pid: int, data: str | bytes) -> None:
        """Type ``data`` into the terminal (``"\\x03"`` is ctrl-C, ``"\\x04"`` ctrl-D).

        Raises:
            ProcessNotFound; InvalidRequest: the process has no terminal;
            SandboxError: the terminal has read nothing for 10 s (its input is full).
        """
        raw = data.encode() if isinstance(data, str) else bytes(data)
        payload = {"pty": base64.b64encode(raw).decode()}
        await self._link.unary(PROCESS, "SendInput", {"process": {"pid": pid}, "input": payload})

    async def resize(self, pid: int, rows: int, cols: int) -> None:
        """Set the terminal's size (its foreground program gets ``SIGWINCH``).

        Raises:
            InvalidRequest: a bad size, or the process has no terminal; ProcessNotFound.
        """
        message = {"process": {"pid": pid}, "pty": terminal_size(rows, cols)}
        await self._link.unary(PROCESS, "Update", message)

    async def kill(self, pid: int) -> bool:
        """SIGKILL the terminal's whole session (the shell and its jobs). False if it was
        not running."""
        try:
            await self._link.unary(
                PROCESS, "SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
            )
        except ProcessNotFound:
            return False
        return True


class AsyncPtyHandle:
    """A running terminal: its ``pid``, its output as it comes, and its end.

    A task reads the output from the moment it starts: ``on_data`` gets each chunk as it
    arrives; without it, iterate the handle (``async for chunk in term``: ``bytes``; up to
    64 chunks wait for the first read, then the terminal waits too). ``await term.wait()``
    for the exit code (from then on output nobody takes is dropped).
    """

    def __init__(
        self, pty: AsyncPty, stream: RpcStream, pid: int, on_data: DataCallback | None
    ) -> None:
        self.pid = pid
        self._pty = pty
        self._stream = stream
        self._on_data = on_data
        self._end: dict[str, Any] | None = None
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue(_QUEUED_CHUNKS)
        self._waiting = False
        self._reader = asyncio.ensure_future(self._read_all())
        self._reader.add_done_callback(_retrieved)

    @classmethod
    async def started(
        cls, pty: AsyncPty, stream: RpcStream, on_data: DataCallback | None
    ) -> AsyncPtyHandle:
        """The handle, once the stream's first event (``start``) has told the pid."""
        try:
            first = await stream.next()
            start = _event(first).get("start")
            if not isinstance(start, dict) or not isinstance(start.get("pid"), int):
                raise SandboxError("the sandbox's answer did not begin with a start event")
        except BaseException:
            await stream.aclose()
            raise
        return cls(pty, stream, start["pid"], on_data)

    def __aiter__(self) -> AsyncPtyHandle:
        return self

    async def __anext__(self) -> bytes:
        if self._chunks.empty() and not self._reader.done():
            getter = asyncio.ensure_future(self._chunks.get())
            try:
                await asyncio.wait({getter, self._reader}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()
        if not self._chunks.empty():
            return self._chunks.get_nowait()
        if not self._reader.cancelled():
            self._reader.result()  # the error that ended the stream, if any
        raise StopAsyncIteration

    async def _read_all(self) -> None:
        try:
            while self._end is None:
                message = await self._stream.next()
                if message is None:
                    raise SandboxError(
                        f"terminal {self.pid}: the stream ended without an end event "
                        "(the sandbox may have been killed)"
                    )
                event = _event(message)
                if isinstance(event.get("end"), dict):
                    self._end = event["end"]
                    break
                data = event.get("data")
                if isinstance(data, dict) and isinstance(data.get("pty"), str):
                    await self._deliver(_decoded(data["pty"]))
        finally:
            await self._stream.aclose()

    async def _deliver(self, chunk: bytes) -> None:
        if self._on_data is not None:
            outcome = self._on_data(chunk)
            if inspect.isawaitable(outcome):
                await outcome
        elif not self._waiting:
            await self._chunks.put(chunk)  # a full queue holds the terminal back

    async def wait(self) -> int:
        """Wait for the end; the exit code (-1 when a signal ended it).

        Raises:
            CommandTimeout: it ran past its ``timeout`` and was killed.
            SandboxError: the stream broke off without an end (the sandbox ended).
        """
        self._waiting = True
        while not self._chunks.empty():
            self._chunks.get_nowait()  # unblock a reader held back by unread output
        await asyncio.shield(self._reader)
        assert self._end is not None  # the reader returns only after the end event
        return end_result(self._end, "", "").exit_code

    async def send_input(self, data: str | bytes) -> None:
        await self._pty.send_input(self.pid, data)

    async def resize(self, rows: int, cols: int) -> None:
        await self._pty.resize(self.pid, rows, cols)

    async def kill(self) -> bool:
        return await self._pty.kill(self.pid)

    async def disconnect(self) -> None:
        """Stop watching it; the terminal keeps running (``pty.connect`` watches again)."""
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def _event(message: dict[str, Any] | None) -> dict[str, Any]:
    event = (message or {}).get("event")
    return event if isinstance(event, dict) else {}


def _decoded(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SandboxError("the sandbox sent terminal output that is not base64") from None


def _retrieved(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()
