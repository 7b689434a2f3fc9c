"""Code contexts: ``sbx.run_code`` and its contexts, as E2B's code-interpreter SDK shapes them.

A context is a persistent interpreter in the sandbox (Python by default; bash too): variables,
imports and the working directory live on between cells. ``run_code`` sends one cell and
reads the answer, JSON lines as the cell runs (``stdout``, ``stderr``, ``result``,
``error``, ``number_of_executions``, ``end_of_execution``), into an ``Execution``; the
callbacks get each message as it arrives. An error in the cell is data
(``Execution.error``), never raised.

What the sandbox answers is the sandboxed code's word: every line, and the whole answer, is
read with a cap, and an answer cut short (no ``end_of_execution``) is an error.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from ringfence.client import _base
from ringfence.client._connect import ORIGIN_HEADER, error_from_answer
from ringfence.client._link import Link
from ringfence.errors import (
    InvalidRequest,
    NotFound,
    RingfenceError,
    SandboxError,
    SandboxNotRunning,
)
from ringfence.models import SandboxState

__all__ = [
    "AsyncCode",
    "Context",
    "ContextNotFound",
    "Execution",
    "ExecutionError",
    "Logs",
    "OutputMessage",
    "Result",
    "execute_message",
]

# A plot or a table is one line; a long-running cell's output is many. Both are bounded: a
# hostile sandbox could answer without end.
MAX_LINE = 16 * 1024 * 1024
MAX_ANSWER = 64 * 1024 * 1024
_CONTEXT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what the server's routes accept
_REST_TIMEOUT = 120.0
# How long past a cell's deadline its answer may take: the daemon interrupts the cell, and
# restarts the context if the interrupt does not stop it.
_DEADLINE_SLACK = 30.0
# Pauses between looks at whether a sandbox that broke off an answer has ended.
_SETTLE = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)
_FORMATS = ("html", "markdown", "svg", "png", "jpeg", "latex", "json", "javascript")

M = TypeVar("M")


class ContextNotFound(NotFound):
    """No code context with this id exists in the sandbox (it never did, or was removed)."""


@dataclass(frozen=True)
class Context:
    """A code context: a persistent interpreter of ``language``, started in ``cwd``."""

    id: str
    language: str
    cwd: str

    @classmethod
    def from_message(cls, message: object) -> Context:
        """Raises ``SandboxError`` when the sandbox described it malformed."""
        if not isinstance(message, dict) or not isinstance(message.get("id"), str):
            raise SandboxError("the sandbox described a code context without an id")
        return cls(message["id"], str(message.get("language", "")), str(message.get("cwd", "")))


@dataclass(frozen=True)
class OutputMessage:
    """A piece of a cell's stdout or stderr, as it arrived (``str()`` of it is the text)."""

    line: str
    timestamp: datetime | None = None
    error: bool = False  # True for stderr

    def __str__(self) -> str:
        return self.line


@dataclass(frozen=True)
class Result:
    """A value the cell displayed, in every format it offers: the value of its last line
    (``is_main_result``), ``display(x)`` calls, matplotlib figures.

    ``png`` and ``jpeg`` are base64; ``json`` is the parsed value. ``extra`` holds formats
    this SDK does not know by name.
    """

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    is_main_result: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> Result:
        fields: dict[str, Any] = {
            name: _text_or_none(message.get(name)) for name in ("text", *_FORMATS)
        }
        fields["json"] = message.get("json")
        known = {"type", "is_main_result", "text", *_FORMATS}
        extra = {key: value for key, value in message.items() if key not in known}
        return cls(**fields, is_main_result=message.get("is_main_result") is True, extra=extra)

    def formats(self) -> list[str]:
        """The formats it has besides ``text`` (``["html", "png"]``...)."""
        return [name for name in _FORMATS if getattr(self, name) is not None] + list(self.extra)

    def __str__(self) -> str:
        return self.text or ""


@dataclass(frozen=True)
class ExecutionError:
    """An exception the cell raised (or, for bash, a non-zero status: ``ExitStatus``)."""

    name: str
    value: str
    traceback: str


@dataclass
class Logs:
    """What a cell printed, in the chunks it arrived in."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass
class Execution:
    """The outcome of one cell. A failing cell is not an exception: see ``error``."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None

    @property
    def text(self) -> str | None:
        """The text of the main result (the value of the cell's last line), if any."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None


OutputCallback = Callable[[OutputMessage], object]  # each may return an awaitable
ResultCallback = Callable[[Result], object]
ErrorCallback = Callable[[ExecutionError], object]


def context_id(context: Context | str) -> str:
    """The id of a context or of its id.

    Raises:
        ContextNotFound: no context can have that id.
    """
    identifier = context.id if isinstance(context, Context) else context
    if not isinstance(identifier, str) or not _CONTEXT_ID.match(identifier):
        raise ContextNotFound(f"no code context {identifier!r}")
    return identifier


def execute_message(
    code: str,
    *,
    context: Context | str | None,
    language: str | None,
    envs: Mapping[str, str] | None,
    timeout: float | None,
) -> dict[str, Any]:
    """The body of ``POST /code/execute``.

    Raises:
        InvalidRequest: code that is not a string, both ``context`` and ``language``, a
            negative timeout, environment values that are not strings.
        ContextNotFound: an id no context can have.
    """
    if not isinstance(code, str):
        raise InvalidRequest("code must be a string")
    if context is not None and language is not None:
        raise InvalidRequest("give a context or a language, not both (a context has one)")
    message: dict[str, Any] = {"code": code}
    if context is not None:
        message["context_id"] = context_id(context)
    if language is not None:
        message["language"] = language
    if envs:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in envs.items()):
            raise InvalidRequest("envs must map strings to strings")
        message["env_vars"] = dict(envs)
    if timeout is not None and timeout < 0:
        raise InvalidRequest("timeout must be positive (or None / 0 for no deadline)")
    if timeout:
        message["timeout"] = timeout
    return message


class _Reader:
    """Folds the answer's messages into an ``Execution``, calling back as they come."""

    def __init__(
        self,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        on_result: ResultCallback | None,
        on_error: ErrorCallback | None,
    ) -> None:
        self.execution = Execution()
        self.ended = False
        self._on_stdout, self._on_stderr = on_stdout, on_stderr
        self._on_result, self._on_error = on_result, on_error

    async def take(self, message: dict[str, Any]) -> None:
        """One message. Unknown types are skipped: a newer daemon may send more."""
        kind = message.get("type")
        if kind in ("stdout", "stderr"):
            text = message.get("text")
            if not isinstance(text, str):
                raise SandboxError(f"the sandbox sent {kind} that is not text")
            out = OutputMessage(text, _timestamp(message.get("timestamp")), kind == "stderr")
            if kind == "stdout":
                self.execution.logs.stdout.append(text)
                await _call(self._on_stdout, out)
            else:
                self.execution.logs.stderr.append(text)
                await _call(self._on_stderr, out)
        elif kind == "result":
            result = Result.from_message(message)
            self.execution.results.append(result)
            await _call(self._on_result, result)
        elif kind == "error":
            error = ExecutionError(
                str(message.get("name", "")),
                str(message.get("value", "")),
                str(message.get("traceback", "")),
            )
            self.execution.error = error  # the last one wins, as with E2B
            await _call(self._on_error, error)
        elif kind == "number_of_executions":
            count = message.get("execution_count")
            if not isinstance(count, int) or isinstance(count, bool):
                raise SandboxError("the sandbox sent an execution count that is not a number")
            self.execution.execution_count = count
        elif kind == "end_of_execution":
            self.ended = True


class AsyncCode:
    """The code contexts of one sandbox (``AsyncSandbox.run_code`` and friends call it)."""

    def __init__(
        self,
        link: Link,
        *,
        max_line: int = MAX_LINE,
        max_answer: int = MAX_ANSWER,
        settle: Sequence[float] = _SETTLE,
    ) -> None:
        """``max_line`` and ``max_answer`` bound what a sandbox may answer (bytes);
        ``settle``: the pauses between looks at whether a sandbox that broke off an answer
        has ended."""
        self._link = link
        self._max_line = max_line
        self._max_answer = max_answer
        self._settle = tuple(settle)

    async def run(
        self,
        code: str,
        *,
        context: Context | str | None = None,
        language: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_result: ResultCallback | None = None,
        on_error: ErrorCallback | None = None,
        envs: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Execution:
        """See ``AsyncSandbox.run_code``."""
        message = execute_message(
            code, context=context, language=language, envs=envs, timeout=timeout
        )
        reader = _Reader(on_stdout, on_stderr, on_result, on_error)
        # A cell may run silent for as long as its deadline allows (for ever, without one).
        read = timeout + _DEADLINE_SLACK if timeout else None
        request = self._link.http.build_request(
            "POST",
            f"{self._link.base}/code/execute",
            json=message,
            timeout=httpx.Timeout(_REST_TIMEOUT, read=read),
        )
        try:
            response = await self._link.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self._link.settings.url) from exc
        try:
            if response.status_code != 200:
                raise await self._error(response)
            async for line in _lines(response, self._max_line, self._max_answer):
                await reader.take(_parse(line))
                if reader.ended:
                    return reader.execution
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self._link.settings.url) from exc
        finally:
            await response.aclose()
        raise await self._cut_short()

    async def create_context(self, language: str | None = None, cwd: str | None = None) -> Context:
        """See ``AsyncSandbox.create_code_context``."""
        body = {k: v for k, v in (("language", language), ("cwd", cwd)) if v is not None}
        return Context.from_message(await self._call("POST", "/code/contexts", body))

    async def list_contexts(self) -> list[Context]:
        """See ``AsyncSandbox.list_code_contexts``."""
        answer = await self._call("GET", "/code/contexts")
        if not isinstance(answer, list):
            raise SandboxError("the sandbox listed its code contexts as something not a list")
        return [Context.from_message(item) for item in answer]

    async def restart_context(self, context: Context | str) -> None:
        """See ``AsyncSandbox.restart_code_context``."""
        await self._call("POST", f"/code/contexts/{quote(context_id(context))}/restart")

    async def remove_context(self, context: Context | str) -> None:
        """See ``AsyncSandbox.remove_code_context``."""
        await self._call("DELETE", f"/code/contexts/{quote(context_id(context))}")

    async def _call(self, method: str, suffix: str, body: object = None) -> Any:
        """A context call; its JSON answer (None for an empty one)."""
        request = self._link.http.build_request(
            method, self._link.base + suffix, json=body, timeout=_REST_TIMEOUT
        )
        try:
            response = await self._link.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self._link.settings.url) from exc
        try:
            if response.status_code not in (200, 201, 204):
                raise await self._error(response)
            raw = await _read_all(response, self._max_line)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self._link.settings.url) from exc
        finally:
            await response.aclose()
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise SandboxError("the sandbox answered something not JSON") from None

    async def _error(self, response: httpx.Response) -> RingfenceError:
        """The typed error of a non-success answer, from the server or the sandbox."""
        body = await _read_all(response, self._max_line)
        from_sandbox = response.headers.get(ORIGIN_HEADER) == "sandbox"
        return error_from_answer(
            response.status_code, body, ContextNotFound, from_sandbox=from_sandbox
        )

    async def _cut_short(self) -> RingfenceError:
        """Why an answer ended before ``end_of_execution``: the sandbox ended, or broke.

        The server stores a sandbox's end a moment after its daemon's answers break off, so
        its state is asked a few times, for about a second and a half at most.
        """
        ended = {state.value for state in SandboxState if state.is_terminal}
        for delay in self._settle:
            await asyncio.sleep(delay)
            try:
                state = (await self._link.rest("GET")).get("state")
            except (RingfenceError, AttributeError):
                break
            if state in ended:
                return SandboxNotRunning(f"sandbox {self._link.sandbox_id} ended ({state})")
        return SandboxError(
            "the sandbox's answer to run_code ended before the end of the execution"
        )


async def _lines(response: httpx.Response, max_line: int, max_answer: int) -> AsyncIterator[bytes]:
    """The answer's lines as they complete, each at most ``max_line`` bytes, all of them at
    most ``max_answer``; a last line without its newline too."""
    buffer = bytearray()
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_answer:
            raise SandboxError(f"the sandbox answered run_code with more than {max_answer} bytes")
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.strip():
                yield line
        if len(buffer) > max_line:
            raise SandboxError(f"the sandbox sent a line of more than {max_line} bytes")
    if buffer.strip():
        yield bytes(buffer)


async def _read_all(response: httpx.Response, cap: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise SandboxError(f"the sandbox answered more than {cap} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _parse(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError:
        raise SandboxError("the sandbox sent a line that is not JSON") from None
    if not isinstance(message, dict):
        raise SandboxError("the sandbox sent a line that is not a JSON object")
    return message


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


async def _call(callback: Callable[[M], object] | None, message: M) -> None:
    if callback is not None:
        outcome = callback(message)
        if inspect.isawaitable(outcome):
            await outcome
