"""``/v1/proposals``: remediations proposed by agents, decided by humans, run once approved."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from ringfence.models import Proposal, ProposalSpec, ProposalState
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody

__all__ = ["router"]

router = APIRouter(prefix="/v1/proposals", tags=["proposals"])

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such proposal in your tenant"},
}
_DECISION_ERRORS: dict[int | str, dict[str, object]] = {
    **_ERRORS,
    403: {"model": ErrorBody, "description": "An agent key, or your own proposal"},
    409: {
        "model": ErrorBody,
        "description": "Not pending (decided, expired, running or done), already approved "
        "by you, or the digest is not the proposed request's",
    },
}


class Approval(BaseModel):
    digest: str = Field(
        min_length=64, max_length=64, description="The proposal's digest, as you reviewed it."
    )
    reason: str = Field("", max_length=10_000)


class Rejection(BaseModel):
    reason: str = Field(min_length=1, max_length=10_000, description="Why: it is recorded.")


@router.post(
    "",
    response_model=Proposal,
    status_code=201,
    responses={**_ERRORS, 403: {"model": ErrorBody, "description": "Not allowed here"}},
    summary="Propose a remediation; it runs once approved",
)
async def propose(body: ProposalSpec, caller: Caller, request: Request) -> Proposal:
    """Any key may propose. The request is fixed from now on (its digest is returned); it
    waits for approval until ``expires_at``."""
    return await deps.approvals(request).propose(caller, body)


@router.get("", response_model=list[Proposal], responses=_ERRORS, summary="Your proposals")
async def list_proposals(
    caller: Caller,
    request: Request,
    state: Annotated[list[ProposalState] | None, Query(description="Only these states.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[Proposal]:
    return await deps.approvals(request).list(caller.tenant, states=state or None, limit=limit)


@router.get("/{proposal_id}", response_model=Proposal, responses=_ERRORS, summary="A proposal")
async def get_proposal(proposal_id: str, caller: Caller, request: Request) -> Proposal:
    return await deps.approvals(request).get(caller.tenant, proposal_id)


@router.post(
    "/{proposal_id}/approve",
    response_model=Proposal,
    responses=_DECISION_ERRORS,
    summary="Approve (approver and admin keys); with enough approvals it runs at once",
)
async def approve(proposal_id: str, body: Approval, caller: Caller, request: Request) -> Proposal:
    return await deps.approvals(request).approve(caller, proposal_id, body.digest, body.reason)


@router.post(
    "/{proposal_id}/reject",
    response_model=Proposal,
    responses=_DECISION_ERRORS,
    summary="Reject, with a reason (approver and admin keys)",
)
async def reject(proposal_id: str, body: Rejection, caller: Caller, request: Request) -> Proposal:
    return await deps.approvals(request).reject(caller, proposal_id, body.reason)
