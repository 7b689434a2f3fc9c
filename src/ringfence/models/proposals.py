"""Proposals: a remediation an agent asks to run, and the human decisions on it.

A proposal is a checkpoint: ``pending`` until enough approvers approve it (then it runs at
once: ``executing``, then ``succeeded`` or ``failed``), one rejects it (``rejected``), or
its approval window closes (``expired``). The request is fixed when proposed: an approval
names the request's digest, and a different request needs a new proposal.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from ringfence.models.executions import ExecutionRequest, ExecutionResult

__all__ = [
    "Decision",
    "Proposal",
    "ProposalSpec",
    "ProposalState",
    "Risk",
    "RiskSource",
    "is_proposal_id",
    "new_proposal_id",
    "request_digest",
]


class Risk(StrEnum):
    LOW = "low"
    HIGH = "high"  # needs more than one approver (high_risk_approvals)


class RiskSource(StrEnum):
    """Who set a proposal's risk. The strings are API."""

    PROPOSER = "proposer"  # the proposer's choice (the operator's policy asked no more)
    POLICY = "policy"  # the operator's risk policy (``risk_rules`` name its rules)


class ProposalState(StrEnum):
    """The strings are API: they never change."""

    PENDING = "pending"
    APPROVED = "approved"  # enough approvals; about to run
    REJECTED = "rejected"
    EXPIRED = "expired"  # the approval window closed first
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        return self in (
            ProposalState.REJECTED,
            ProposalState.EXPIRED,
            ProposalState.SUCCEEDED,
            ProposalState.FAILED,
        )


class ProposalSpec(BaseModel):
    """What an agent proposes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request: ExecutionRequest = Field(
        description="Exactly what will run once approved (checkpoint_id and approved_by are "
        "filled in by the approval handler, and may not be set here; its id is replaced by "
        "the proposal's id, the id the approved execution runs under)."
    )
    rationale: str = Field(min_length=1, max_length=10_000, description="Why, for the human.")
    risk: Risk = Field(
        Risk.LOW,
        description="high needs two distinct approvers (by default). The operator's risk "
        "policy may raise it, and may refuse the proposal; a proposer cannot lower it.",
    )
    session_id: str | None = Field(None, max_length=256)
    task_id: str | None = Field(None, max_length=256)


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True)

    by: str = Field(description="The key id that decided.")
    at: datetime
    reason: str


class Proposal(BaseModel):
    """A proposal and everything decided about it."""

    model_config = ConfigDict(frozen=True)

    id: str
    state: ProposalState
    request: ExecutionRequest
    digest: str = Field(description="SHA-256 of the request: what an approval approves.")
    rationale: str
    risk: Risk = Field(
        description="The higher of the proposer's risk and the operator's risk policy's."
    )
    risk_source: RiskSource = Field(
        RiskSource.PROPOSER,
        description="Who set the risk: the proposer, or the operator's policy (never lower "
        "than the proposer's).",
    )
    risk_rules: list[str] = Field(
        default_factory=list,
        description="The ids of the operator's policy rules that set the risk (risk_source "
        "policy).",
    )
    session_id: str | None = None
    task_id: str | None = None
    proposed_by: str = Field(description="The key id that proposed it.")
    created_at: datetime
    expires_at: datetime = Field(description="Approvals after this are refused.")
    required_approvals: int
    approvals: list[Decision] = Field(default_factory=list)
    rejection: Decision | None = None
    execution_id: str | None = Field(
        None, description="Set when it runs: the proposal's id (no client can submit one)."
    )
    result: ExecutionResult | None = None
    version: int = Field(0, description="Bumped at every change (optimistic concurrency).")
    # The request's egress header values, sealed (service/credentials.py); the request
    # shows markers in their place. In no dump, repr or answer: only the store writes it.
    sealed_credentials: str | None = Field(None, exclude=True, repr=False)


def request_digest(request: ExecutionRequest) -> str:
    """SHA-256 of the request's canonical JSON: any change to it changes the digest."""
    canonical = json.dumps(
        request.model_dump(mode="json"), sort_keys=True, separators=(",", ":")
    ).encode()
    return hashlib.sha256(canonical).hexdigest()


# A proposal's id is also the id its execution runs under. The form is the server's: no
# client may submit an execution under it, so no client can take a proposal's run's id.
_PROPOSAL_ID = re.compile(r"^cp[0-9a-f]{20}$")


def new_proposal_id() -> str:
    return "cp" + secrets.token_hex(10)


def is_proposal_id(execution_id: str) -> bool:
    """Whether ``execution_id`` has the form reserved for proposals' executions."""
    return _PROPOSAL_ID.match(execution_id) is not None
