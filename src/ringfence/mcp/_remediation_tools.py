"""Tools for remediations: propose one, and follow it. There is deliberately no tool that
approves: a human does that, in the console, the CLI or the API, with an approver's key."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import Field

from ringfence.mcp._connect import Connector, session
from ringfence.mcp._registry import add_tool
from ringfence.mcp._schemas import ProposalView
from ringfence.models import Risk

__all__ = ["RemediationTools"]

LOG_CHARS = 20_000

_PROPOSES = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=True)
_READ_ONLY = ToolAnnotations(readOnlyHint=True, openWorldHint=False)


class RemediationTools:
    def __init__(self, connector: Connector) -> None:
        self._connector = connector

    def register(self, server: MCPServer) -> None:
        add_tool(server, self.remediation_propose, "Propose a remediation", _PROPOSES)
        add_tool(server, self.remediation_status, "A remediation's status", _READ_ONLY)

    async def remediation_propose(
        self,
        ctx: Context,
        command: Annotated[
            list[str],
            Field(
                min_length=1,
                description="The exact program and arguments to run, e.g. "
                "['kubectl', 'scale', 'deployment/web', '--replicas=3'] (no shell).",
            ),
        ],
        rationale: Annotated[
            str,
            Field(
                min_length=1,
                max_length=10_000,
                description="Why it is needed, for the human who decides.",
            ),
        ],
        risk: Annotated[Risk, Field(description="high needs more than one approver.")] = Risk.LOW,
        timeout: Annotated[
            float | None, Field(gt=0, description="Seconds it may run once approved.")
        ] = None,
        env: Annotated[
            dict[str, str] | None, Field(description="Its environment variables.")
        ] = None,
        target_namespace: Annotated[
            str | None, Field(description="The Kubernetes namespace it acts on, if any.")
        ] = None,
        remediation_action: Annotated[
            str | None, Field(description="A short name of the action, e.g. scale-deployment.")
        ] = None,
        session_id: Annotated[str | None, Field(description="Your session, for the audit.")] = None,
        task_id: Annotated[str | None, Field(description="Your task, for the audit.")] = None,
    ) -> ProposalView:
        """Propose a remediation: an exact command that runs once, in a locked-down sandbox,
        only after a human approves it. Returns at once with state pending; the approval is
        not yours to give. Follow it with remediation_status."""
        fields = {
            "timeout": timeout, "env": env, "target_namespace": target_namespace,
            "remediation_action": remediation_action,
        }  # fmt: skip
        async with session(self._connector, ctx) as rf:
            proposal = await rf.client.proposals.create(
                command, rationale=rationale, risk=risk, session_id=session_id,
                task_id=task_id, **{k: v for k, v in fields.items() if v is not None},
            )  # fmt: skip
        return ProposalView.of(proposal, LOG_CHARS)

    async def remediation_status(
        self,
        ctx: Context,
        proposal_id: Annotated[
            str, Field(description="The proposal, as remediation_propose returned it.")
        ],
    ) -> ProposalView:
        """A proposed remediation's state: pending, approved, rejected (and why), expired,
        executing, succeeded or failed, with its output once it has run."""
        async with session(self._connector, ctx) as rf:
            proposal = await rf.client.proposals.get(proposal_id)
        return ProposalView.of(proposal, LOG_CHARS)
