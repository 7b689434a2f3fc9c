"""Tools for sandboxes: create, list, get, set_timeout, kill; run a command; run code."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Annotated, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from ringfence.client import AsyncCommandHandle, CommandTimeout
from ringfence.errors import InvalidRequest, RingfenceError
from ringfence.mcp._bounds import OutputCap
from ringfence.mcp._cell import CellCollector, CellOverflow
from ringfence.mcp._connect import Connector, session, tool_error
from ringfence.mcp._registry import add_tool
from ringfence.mcp._schemas import (
    CodeContextInfo,
    CodeRun,
    CommandRun,
    SandboxList,
    SandboxView,
)
from ringfence.models import ResourceLimits, SandboxSpec, SandboxState

__all__ = ["MAX_COMMAND_OUTPUT", "SandboxTools"]

# Output a command may print before it is killed: what is kept is bounded anyway, and a
# command printing without end would only keep the server busy.
MAX_COMMAND_OUTPUT = 16 << 20
DEFAULT_OUTPUT_CHARS = 20_000
MAX_OUTPUT_CHARS = 200_000

SandboxId = Annotated[str, Field(description="The sandbox, as sandbox_create returned it.")]
OutputChars = Annotated[
    int,
    Field(
        ge=100, le=MAX_OUTPUT_CHARS,
        description="Most characters of each of stdout and stderr to return; the middle of "
        "longer output is cut.",
    ),
]  # fmt: skip

_READ_ONLY = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
_CHANGES = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=False)
_DESTROYS = ToolAnnotations(readOnlyHint=False, destructiveHint=True, openWorldHint=False)


class SandboxTools:
    def __init__(self, connector: Connector) -> None:
        self._connector = connector

    def register(self, server: MCPServer) -> None:
        add_tool(server, self.sandbox_create, "Create a sandbox", _CHANGES)
        add_tool(server, self.sandbox_list, "List sandboxes", _READ_ONLY)
        add_tool(server, self.sandbox_get, "Get a sandbox", _READ_ONLY)
        add_tool(server, self.sandbox_set_timeout, "Set a sandbox's timeout", _CHANGES)
        add_tool(server, self.sandbox_kill, "Kill a sandbox", _DESTROYS)
        add_tool(server, self.run_command, "Run a command", _DESTROYS)
        add_tool(server, self.run_code, "Run code", _DESTROYS)
        add_tool(server, self.code_context_create, "Create a code context", _CHANGES)

    async def sandbox_create(
        self,
        ctx: Context,
        template: Annotated[
            str,
            Field(
                description="Root filesystem: 'base' (python3, a shell, the usual "
                "tools) or a template the operator built."
            ),
        ] = "base",
        timeout: Annotated[
            float | None,
            Field(
                gt=0,
                description="Seconds until it is killed; default 300. "
                "sandbox_set_timeout moves it.",
            ),
        ] = None,
        metadata: Annotated[
            dict[str, str] | None, Field(description="Your labels, for sandbox_list.")
        ] = None,
        env: Annotated[
            dict[str, str] | None, Field(description="Environment of every command.")
        ] = None,
        memory: Annotated[
            str | None, Field(description="Memory of the whole sandbox, e.g. '512M', '1G'.")
        ] = None,
        cpus: Annotated[float | None, Field(gt=0, description="CPU limit in cores.")] = None,
        pids: Annotated[int | None, Field(ge=1, description="Most processes at once.")] = None,
        disk: Annotated[
            str | None, Field(description="Size of each writable filesystem, e.g. '256M'.")
        ] = None,
    ) -> SandboxView:
        """Create an isolated Linux sandbox (no network, an unprivileged user, a writable
        home /home/user) and return its sandbox_id, once it is ready for commands and files.
        It lives until its timeout (default 300 s) or sandbox_kill; everything in it is lost
        then."""
        limits = {"memory": memory, "cpus": cpus, "pids": pids, "disk": disk}
        async with session(self._connector, ctx) as rf:
            try:
                spec = SandboxSpec(
                    template=template, timeout=timeout, env=env or {}, metadata=metadata or {},
                    limits=ResourceLimits(**{k: v for k, v in limits.items() if v is not None}),
                )  # fmt: skip
            except ValueError as exc:
                raise tool_error(InvalidRequest(str(exc))) from exc
            return SandboxView.of(await rf.create(spec))

    async def sandbox_list(
        self,
        ctx: Context,
        state: Annotated[
            list[SandboxState] | None,
            Field(description="Only sandboxes in these states; default: all."),
        ] = None,
        metadata: Annotated[
            dict[str, str] | None, Field(description="Only sandboxes with all these labels.")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=100, description="Most sandboxes to return.")] = 20,
    ) -> SandboxList:
        """Your sandboxes (your key's tenant only), newest first."""
        async with session(self._connector, ctx) as rf:
            found = await rf.list(state or [], metadata or {}, limit + 1)
        return SandboxList(
            sandboxes=[SandboxView.of(s) for s in found[:limit]], truncated=len(found) > limit
        )

    async def sandbox_get(self, ctx: Context, sandbox_id: SandboxId) -> SandboxView:
        """A sandbox's state (running, or how it ended), its limits and when it expires."""
        async with session(self._connector, ctx) as rf:
            return SandboxView.of(await rf.info(sandbox_id))

    async def sandbox_set_timeout(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        timeout: Annotated[float, Field(gt=0, description="Seconds from now.")],
    ) -> SandboxView:
        """Kill the sandbox `timeout` seconds from now (sooner or later than before)."""
        async with session(self._connector, ctx) as rf:
            return SandboxView.of(await rf.set_timeout(sandbox_id, timeout))

    async def sandbox_kill(self, ctx: Context, sandbox_id: SandboxId) -> SandboxView:
        """Kill the sandbox: every process in it, and everything it wrote. Killing an ended
        sandbox is no error."""
        async with session(self._connector, ctx) as rf:
            return SandboxView.of(await rf.kill(sandbox_id))

    async def run_command(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        command: Annotated[
            str, Field(min_length=1, description="A bash command line (bash -l -c).")
        ],
        timeout: Annotated[
            float, Field(gt=0, le=3600, description="Seconds; then the command is killed.")
        ] = 60,
        cwd: Annotated[
            str | None, Field(description="Working directory; default /home/user.")
        ] = None,
        env: Annotated[
            dict[str, str] | None, Field(description="Added to the sandbox's environment.")
        ] = None,
        max_output_chars: OutputChars = DEFAULT_OUTPUT_CHARS,
    ) -> CommandRun:
        """Run a shell command in the sandbox and wait for it to end. A non-zero exit is a
        result, not an error. Output is bounded: the middle of long output is cut (flagged
        truncated); a command printing more than 16 MiB is killed."""
        stdout, stderr = OutputCap(max_output_chars), OutputCap(max_output_chars)
        runaway = asyncio.Event()

        def take(cap: OutputCap) -> Callable[[str], None]:
            def add(text: str) -> None:
                cap.add(text)
                if stdout.total + stderr.total > MAX_COMMAND_OUTPUT:
                    runaway.set()

            return add

        async with session(self._connector, ctx) as rf:
            sandbox = await rf.running(sandbox_id)
            # Started in full even if the call is cancelled meanwhile: the command runs from
            # the moment the daemon takes the request, and only its handle (its pid) lets
            # it be killed. A cancel that came during the start is delivered in ``_outcome``.
            with anyio.CancelScope(shield=True):
                handle = await sandbox.commands.run(
                    command, background=True, timeout=timeout, cwd=cwd, envs=env,
                    on_stdout=take(stdout), on_stderr=take(stderr),
                )  # fmt: skip
            timed_out, exit_code, error = await _outcome(handle, runaway)
        out, out_cut = stdout.text()
        err, err_cut = stderr.text()
        return CommandRun(
            sandbox_id=sandbox_id, exit_code=exit_code, stdout=out, stdout_truncated=out_cut,
            stderr=err, stderr_truncated=err_cut, timed_out=timed_out, error=error,
        )  # fmt: skip

    async def run_code(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        code: Annotated[str, Field(description="The cell to run.")],
        language: Annotated[
            Literal["python", "javascript", "bash"] | None,
            Field(description="Default python. Not with context_id (a context has one)."),
        ] = None,
        context_id: Annotated[
            str | None,
            Field(
                description="Run in this context (code_context_create); default: the "
                "sandbox's default context of the language."
            ),
        ] = None,
        timeout: Annotated[
            float, Field(gt=0, le=3600, description="Seconds; then the cell is interrupted.")
        ] = 60,
        max_output_chars: OutputChars = DEFAULT_OUTPUT_CHARS,
    ) -> Annotated[CallToolResult, CodeRun]:
        """Run a cell of code in a persistent interpreter (Jupyter-like): variables,
        imports and the working directory stay for the next cell of the same context. The
        value of the last expression comes back as text, and a plot (matplotlib figure or any
        PNG/JPEG value) as an image; an exception is data (error), not a tool error.
        Bounded: at most 50 results, clipped texts; a cell sending more than 10 000 results
        or 16 MiB is interrupted (stopped says so)."""
        cell = CellCollector(max_output_chars)
        execution_count = None
        async with session(self._connector, ctx) as rf:
            sandbox = await rf.running(sandbox_id)
            try:
                run = await sandbox.run_code(
                    code, language=language, context=context_id, timeout=timeout,
                    on_stdout=cell.on_stdout, on_stderr=cell.on_stderr,
                    on_result=cell.on_result, on_error=cell.on_error,
                )  # fmt: skip
                execution_count = run.execution_count
            except CellOverflow:
                pass  # the SDK dropped the answer: the sandbox interrupts the cell
        stdout, out_cut = cell.stdout.text()
        stderr, err_cut = cell.stderr.text()
        results = cell.results
        main = next((r.text for r in results if r.is_main_result), None)
        outcome = CodeRun(
            sandbox_id=sandbox_id, context_id=context_id, text=main, results=results,
            results_dropped=cell.dropped, stdout=stdout, stdout_truncated=out_cut,
            stderr=stderr, stderr_truncated=err_cut, error=cell.error,
            execution_count=execution_count, stopped=cell.stopped,
        )  # fmt: skip
        payload = outcome.model_dump(mode="json")
        text_form = TextContent(type="text", text=json.dumps(payload, indent=2))
        return CallToolResult(content=[text_form, *cell.images], structured_content=payload)

    async def code_context_create(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        language: Annotated[
            Literal["python", "javascript", "bash"], Field(description="Its interpreter.")
        ] = "python",
        cwd: Annotated[
            str | None, Field(description="Its working directory; default /home/user.")
        ] = None,
    ) -> CodeContextInfo:
        """A new code context: an interpreter of its own, with its own variables, for
        run_code's context_id."""
        async with session(self._connector, ctx) as rf:
            sandbox = await rf.running(sandbox_id)
            context = await sandbox.create_code_context(language, cwd)
        return CodeContextInfo(
            sandbox_id=sandbox_id, context_id=context.id, language=context.language,
            cwd=context.cwd,
        )  # fmt: skip


async def _outcome(
    handle: AsyncCommandHandle, runaway: asyncio.Event
) -> tuple[bool, int | None, str | None]:
    """Whether it timed out, its exit code and why it did not exit by itself. A command that
    prints past the limit is killed; so is one whose call is cancelled (nobody would see it)."""
    ended = asyncio.ensure_future(handle.wait())
    watch = asyncio.ensure_future(runaway.wait())
    try:
        await asyncio.wait({ended, watch}, return_when=asyncio.FIRST_COMPLETED)
        if runaway.is_set() and not ended.done():
            await handle.kill()
            await asyncio.gather(ended, return_exceptions=True)
            limit = MAX_COMMAND_OUTPUT >> 20
            return False, -1, f"killed: it printed more than {limit} MiB of output"
        try:
            result = await ended
        except CommandTimeout:
            return True, None, "timed out"
        return False, result.exit_code, result.error
    except asyncio.CancelledError:
        # The MCP server cancels with anyio, which cancels every await in the scope: only
        # a shielded scope lets the command be killed and its reader be ended here.
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(RingfenceError):
                await handle.kill()
            await handle.disconnect()
        raise
    finally:
        watch.cancel()
        if not ended.done():
            ended.cancel()
