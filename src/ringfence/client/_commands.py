"""``sbx.commands``: run commands in a sandbox, in the foreground or the background.

A command is a shell string (run as ``/bin/bash -l -c cmd``, as E2B does) or a list (argv, no
shell). Output streams as it is produced: to ``on_stdout`` / ``on_stderr`` callbacks (each
gets every chunk as text, UTF-8 decoded incrementally), to async iteration over a handle,
and into the ``CommandResult``.

Deadline: ``timeout`` seconds (default 60; ``None`` or 0 for none). At the deadline the daemon
kills the command's whole process group and ``run()`` / ``wait()`` raise ``CommandTimeout``
carrying the output so far. A non-zero exit is not an error: the result says it, and
``result.check()`` raises ``CommandExitError``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, overload

from ringfence.client._errors import CommandTimeout, ProcessNotFound
from ringfence.client._link import Link, RpcStream
from ringfence.client._types import CommandResult, OutputChunk, ProcessInfo
from ringfence.errors import InvalidRequest, SandboxError
from ringfence.sandboxd.methods import PROCESS, USERS

__all__ = [
    "AsyncCommandHandle",
    "AsyncCommands",
    "OutputCallback",
    "check_user",
    "end_result",
    "start_message",
]

OutputCallback = Callable[[str], object]  # may return an awaitable (an async callback)


def check_user(user: str | None) -> None:
    """Raises ``InvalidRequest`` for any user but the sandbox's unprivileged user and its
    root inside (a sandbox whose host cannot map root refuses that one itself)."""
    if user is not None and user not in USERS:
        named = " and ".join(repr(one) for one in USERS)
        raise InvalidRequest(f"user {user!r}: a Ringfence sandbox has the users {named} only")


def start_message(
    cmd: str | Sequence[str],
    *,
    envs: Mapping[str, str] | None,
    cwd: str | None,
    stdin: bool,
    timeout: float | None,
) -> dict[str, Any]:
    """The ``Start`` request for a command.

    Raises:
        InvalidRequest: an empty command, or a negative timeout.
    """
    if isinstance(cmd, str):
        if not cmd.strip():
            raise InvalidRequest("the command is empty")
        program, args = "/bin/bash", ["-l", "-c", cmd]
    else:
        argv = [str(part) for part in cmd]
        if not argv or not argv[0]:
            raise InvalidRequest("the command is empty")
        program, args = argv[0], argv[1:]
    process: dict[str, Any] = {"cmd": program, "args": args}
    if envs:
        process["envs"] = dict(envs)
    if cwd:
        process["cwd"] = cwd
    message: dict[str, Any] = {"process": process, "stdin": stdin}
    if timeout is not None and timeout < 0:
        raise InvalidRequest("timeout must be positive (or None / 0 for no deadline)")
    if timeout:
        message["timeoutMs"] = max(1, round(timeout * 1000))
    return message


def end_result(end: Mapping[str, Any], stdout: str, stderr: str) -> CommandResult:
    """The result of a command from its ``end`` event (proto3: a zero exit code is absent).

    Raises:
        CommandTimeout: the daemon killed it at its deadline (an error, and not exited).
    """
    exited = bool(end.get("exited", False))
    error = end.get("error") or (None if exited else end.get("status") or "killed")
    result = CommandResult(stdout, stderr, _number(end.get("exitCode", 0), "exit code"), error)
    if end.get("error") and not exited:
        raise CommandTimeout(str(end["error"]), result)
    return result


def _number(value: Any, what: str) -> int:
    """An integer field of an event; SandboxError if the sandbox sent something else."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise SandboxError(f"the sandbox sent a {what} that is not a number") from None


def _output(text: str, name: str) -> bytes:
    """The bytes of a ``data`` event; SandboxError if the sandbox sent bad base64."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SandboxError(f"the sandbox sent {name} output that is not base64") from None


def _event(message: dict[str, Any] | None) -> dict[str, Any]:
    """The ``event`` of a process stream message (empty if it has none or a malformed one)."""
    event = (message or {}).get("event")
    return event if isinstance(event, dict) else {}


async def _call(callback: OutputCallback | None, text: str) -> None:
    if callback is not None and text:
        outcome = callback(text)
        if inspect.isawaitable(outcome):
            await outcome


class AsyncCommands:
    """Commands in one sandbox."""

    def __init__(self, link: Link) -> None:
        self._link = link

    @overload
    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: Literal[False] = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = 60,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        stdin: bool = False,
    ) -> CommandResult: ...

    @overload
    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: Literal[True],
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = 60,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        stdin: bool = False,
    ) -> AsyncCommandHandle: ...

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: bool = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = 60,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        stdin: bool = False,
    ) -> CommandResult | AsyncCommandHandle:
        """Run ``cmd`` (a shell string, or an argv list) and wait for it to end; with
        ``background=True``, return a handle as soon as it has started.

        ``envs`` add to the sandbox's environment; ``cwd`` defaults to /home/user;
        ``stdin=True`` keeps its stdin open for ``send_stdin``. The deadline of ``timeout``
        seconds holds for background commands too (pass ``None`` for none).

        Raises:
            CommandTimeout: it ran past ``timeout`` and was killed.
            InvalidRequest: an unknown program or working directory, a ``user`` but
                "user" (the default: uid 1000, no capabilities) and "root" (root inside
                the sandbox's own user namespace, refused where the host cannot map it).
            SandboxNotFound: the sandbox does not exist (or no longer runs).
            ServerUnreachable.
        """
        check_user(user)
        message = start_message(cmd, envs=envs, cwd=cwd, stdin=stdin, timeout=timeout)
        stream = await self._link.stream(PROCESS, "Start", message, user=user)
        handle = await AsyncCommandHandle.started(self, stream, on_stdout, on_stderr)
        if background:
            return handle
        try:
            return await handle.wait()
        except asyncio.CancelledError:
            await asyncio.shield(handle.disconnect())  # stop reading; the command runs on
            raise

    async def connect(
        self,
        pid: int,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> AsyncCommandHandle:
        """Follow a running command again: its output from now on (no replay) and its end.

        Raises:
            ProcessNotFound: no running process has this pid.
        """
        stream = await self._link.stream(PROCESS, "Connect", {"process": {"pid": pid}})
        return await AsyncCommandHandle.started(self, stream, on_stdout, on_stderr)

    async def list(self) -> list[ProcessInfo]:
        """The processes started through the API that are still running."""
        answer = await self._link.unary(PROCESS, "List", {})
        return [ProcessInfo.from_message(p) for p in answer.get("processes") or []]

    async def kill(self, pid: int) -> bool:
        """Kill a command's whole process group (SIGKILL). False if it was not running."""
        try:
            await self._link.unary(
                PROCESS, "SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
            )
        except ProcessNotFound:
            return False
        return True

    async def send_stdin(self, pid: int, data: str | bytes) -> None:
        """Write to a command's stdin (started with ``stdin=True``).

        Raises:
            ProcessNotFound; InvalidRequest: its stdin is closed.
        """
        raw = data.encode() if isinstance(data, str) else bytes(data)
        payload = {"stdin": base64.b64encode(raw).decode()}
        await self._link.unary(PROCESS, "SendInput", {"process": {"pid": pid}, "input": payload})

    async def close_stdin(self, pid: int) -> None:
        """Close a command's stdin (it reads end-of-file). Raises ``ProcessNotFound``."""
        await self._link.unary(PROCESS, "CloseStdin", {"process": {"pid": pid}})


class AsyncCommandHandle:
    """A running command: its ``pid``, its output as it comes, and its end.

    A task reads its output from the moment it starts: callbacks given to ``run`` are called
    as chunks arrive, whether or not anyone waits. Iterate it (``async for chunk in handle``)
    for ``OutputChunk``s, and ``await handle.wait()`` for the result.
    """

    def __init__(
        self,
        commands: AsyncCommands,
        stream: RpcStream,
        pid: int,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> None:
        self.pid = pid
        self._commands = commands
        self._stream = stream
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")(errors="replace")
            for name in ("stdout", "stderr")
        }
        self._output: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._end: dict[str, Any] | None = None
        self._chunks: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._reader = asyncio.ensure_future(self._read_all())
        # How the stream broke off is the answer of wait() and iteration, for whoever asks;
        # nobody may (a background command killed, its sandbox gone): no warning then.
        self._reader.add_done_callback(_retrieved)

    @classmethod
    async def started(
        cls,
        commands: AsyncCommands,
        stream: RpcStream,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> AsyncCommandHandle:
        """The handle, once the stream's first event (``start``) has told the pid."""
        try:
            first = await stream.next()
            start = _event(first).get("start")
            if not isinstance(start, dict):
                raise SandboxError("the sandbox's answer did not begin with a start event")
            pid = _number(start.get("pid", 0), "pid")
        except BaseException:
            await stream.aclose()
            raise
        return cls(commands, stream, pid, on_stdout, on_stderr)

    @property
    def stdout(self) -> str:
        """The standard output received so far."""
        return "".join(self._output["stdout"])

    @property
    def stderr(self) -> str:
        """The standard error received so far."""
        return "".join(self._output["stderr"])

    def __aiter__(self) -> AsyncCommandHandle:
        return self

    async def __anext__(self) -> OutputChunk:
        chunk = await self._chunks.get()
        if chunk is None:
            self._chunks.put_nowait(None)  # every later read ends too
            if self._reader.done() and not self._reader.cancelled():
                self._reader.result()  # the error that ended the stream, if any
            raise StopAsyncIteration
        return chunk

    async def _read_all(self) -> None:
        try:
            while (chunk := await self._next_chunk()) is not None:
                self._chunks.put_nowait(chunk)
            while (chunk := await self._flush()) is not None:
                self._chunks.put_nowait(chunk)
        finally:
            self._chunks.put_nowait(None)
            await self._stream.aclose()

    async def _next_chunk(self) -> OutputChunk | None:
        """The next piece of output; None once the command has ended."""
        while self._end is None:
            try:
                message = await self._stream.next()
            except BaseException:
                await self._stream.aclose()
                raise
            if message is None:
                await self._stream.aclose()
                raise SandboxError(
                    f"process {self.pid}: the output stream ended without an end event "
                    "(the sandbox may have been killed)"
                )
            event = _event(message)
            if isinstance(event.get("end"), dict):
                self._end = event["end"]
                await self._stream.aclose()
                return await self._flush()
            data = event.get("data")
            if isinstance(data, dict):
                for name in ("stdout", "stderr"):
                    if isinstance(data.get(name), str):
                        raw = _output(data[name], name)
                        text = self._decoders[name].decode(raw)
                        if text:
                            return await self._emit(name, text)
        return await self._flush()

    async def _flush(self) -> OutputChunk | None:
        """What the decoders held back (an incomplete character at the very end)."""
        for name in ("stdout", "stderr"):
            text = self._decoders[name].decode(b"", final=True)
            if text:
                return await self._emit(name, text)
        return None

    async def _emit(self, name: str, text: str) -> OutputChunk:
        self._output[name].append(text)
        await _call(self._callbacks[name], text)
        return OutputChunk("stdout" if name == "stdout" else "stderr", text)

    async def wait(self) -> CommandResult:
        """Wait for the end (callbacks keep receiving output until then).

        Raises:
            CommandTimeout: it ran past its ``timeout`` and was killed.
            SandboxError: the stream broke off without an end (the sandbox ended).
        """
        await asyncio.shield(self._reader)
        assert self._end is not None  # the reader returns only after the end event
        return end_result(self._end, self.stdout, self.stderr)

    async def kill(self) -> bool:
        """SIGKILL its process group; False if it had already ended."""
        return await self._commands.kill(self.pid)

    async def send_stdin(self, data: str | bytes) -> None:
        await self._commands.send_stdin(self.pid, data)

    async def close_stdin(self) -> None:
        await self._commands.close_stdin(self.pid)

    async def disconnect(self) -> None:
        """Stop following it; the command keeps running (``commands.connect`` re-attaches)."""
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def _retrieved(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()
