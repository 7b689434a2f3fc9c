"""Tools for a sandbox's state: checkpoint and rollback, pause and resume, fork.

An agent uses them to try something and undo it (checkpoint, then rollback), to put a
sandbox aside while it waits (pause: any later tool call on it resumes it), and to try
several branches from one state (fork). docs/state.md says what is captured."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

from ringfence.mcp._connect import Connector, session
from ringfence.mcp._registry import add_tool
from ringfence.mcp._schemas import SandboxView
from ringfence.models import CHECKPOINT_ID, MAX_FORK_CHILDREN

__all__ = ["StateTools"]

SandboxId = Annotated[str, Field(description="The sandbox, as sandbox_create returned it.")]

_CHANGES = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=False)
_DESTROYS = ToolAnnotations(readOnlyHint=False, destructiveHint=True, openWorldHint=False)


class CheckpointView(BaseModel):
    sandbox_id: str
    checkpoint_id: str = Field(description="Pass it to sandbox_rollback.")
    files: int = Field(description="Entries captured (files, directories, links).")
    bytes: int = Field(description="Bytes it holds that no earlier checkpoint shares.")


class RolledBack(BaseModel):
    sandbox_id: str
    checkpoint_id: str = Field(description="The checkpoint its files are back to.")


class PausedView(BaseModel):
    sandbox: SandboxView
    memory: bool = Field(
        description="True: its processes were stopped with their memory (they go on where "
        "they were). False: only its files were kept (its processes start again)."
    )


class ForkedView(BaseModel):
    parent: str = Field(description="The sandbox forked.")
    children: list[SandboxView] = Field(description="The new sandboxes, one per child.")


class StateTools:
    def __init__(self, connector: Connector) -> None:
        self._connector = connector

    def register(self, server: MCPServer) -> None:
        add_tool(server, self.sandbox_checkpoint, "Checkpoint a sandbox", _CHANGES)
        add_tool(server, self.sandbox_rollback, "Roll a sandbox back", _DESTROYS)
        add_tool(server, self.sandbox_pause, "Pause a sandbox", _CHANGES)
        add_tool(server, self.sandbox_resume, "Resume a sandbox", _CHANGES)
        add_tool(server, self.sandbox_fork, "Fork a sandbox", _CHANGES)

    async def sandbox_checkpoint(self, ctx: Context, sandbox_id: SandboxId) -> CheckpointView:
        """Save the sandbox's files as they are now (its home, /tmp and what was changed in
        its root), in milliseconds; its processes keep running. sandbox_rollback brings the
        files back to it: take one before trying something risky."""
        async with session(self._connector, ctx) as rf:
            made = await (await rf.running(sandbox_id)).checkpoint()
        return CheckpointView(
            sandbox_id=sandbox_id, checkpoint_id=made.id, files=made.files, bytes=made.bytes
        )

    async def sandbox_rollback(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        checkpoint_id: Annotated[
            str,
            Field(pattern=CHECKPOINT_ID, description="A checkpoint of this sandbox."),
        ],
    ) -> RolledBack:
        """Put the sandbox's files back exactly as they were at the checkpoint: files made
        since are removed, changed and deleted ones restored. Processes keep running (what
        they hold in memory is not rolled back)."""
        async with session(self._connector, ctx) as rf:
            await (await rf.running(sandbox_id)).rollback(checkpoint_id)
        return RolledBack(sandbox_id=sandbox_id, checkpoint_id=checkpoint_id)

    async def sandbox_pause(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        memory: Annotated[
            bool,
            Field(
                description="Keep its processes and memory (they go on where they were) "
                "instead of keeping only its files and freeing everything."
            ),
        ] = False,
    ) -> PausedView:
        """Pause the sandbox while you wait (for a human, an event): its timeout stops and
        it stops counting as running. Any later tool call on it resumes it, under the same
        sandbox_id, with its files (and with memory=true, its processes)."""
        async with session(self._connector, ctx) as rf:
            paused = await (await rf.running(sandbox_id)).pause(memory=memory)
        return PausedView(sandbox=SandboxView.of(paused.sandbox), memory=paused.memory)

    async def sandbox_resume(self, ctx: Context, sandbox_id: SandboxId) -> SandboxView:
        """Resume a paused sandbox now (any tool call on it would too); a running one is
        returned as it is."""
        async with session(self._connector, ctx) as rf:
            return SandboxView.of(await (await rf.running(sandbox_id)).resume())

    async def sandbox_fork(
        self,
        ctx: Context,
        sandbox_id: SandboxId,
        count: Annotated[
            int,
            Field(ge=1, le=MAX_FORK_CHILDREN, description="How many new sandboxes to start."),
        ] = 1,
    ) -> ForkedView:
        """Start `count` new sandboxes from the sandbox's files as they are now, to try
        several approaches side by side: each has its own sandbox_id, the same template,
        limits and environment; its processes start fresh. The original is unchanged."""
        async with session(self._connector, ctx) as rf:
            forked = await rf.fork(sandbox_id, count)
        return ForkedView(parent=sandbox_id, children=[SandboxView.of(c) for c in forked.children])
