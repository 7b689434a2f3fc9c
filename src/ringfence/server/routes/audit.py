"""``/v1/audit``: the audit log of your tenant, for approvers and admins."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from ringfence.errors import Forbidden
from ringfence.models import AuditQuery, Role
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody

__all__ = ["router"]

router = APIRouter(prefix="/v1/audit", tags=["audit"])

MAX_SEQ = (1 << 63) - 1  # the store's integers are 64-bit

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    403: {"model": ErrorBody, "description": "Agent keys cannot read the audit log"},
}


class AuditRecordOut(BaseModel):
    """One record of the hash chain, exactly as hashed."""

    seq: int
    at: str = Field(description="RFC 3339, UTC.")
    tenant: str
    actor: str = Field(description="The key id that did it, or 'ringfence'.")
    action: str = Field(description="e.g. sandbox.create, proposal.approve, execution.end.")
    target: str = Field(description="e.g. sandbox:sb…, proposal:cp…, execution:…")
    outcome: str
    details: dict[str, Any]
    prev_hash: str
    hash: str


class PublicKey(BaseModel):
    public_key: str = Field(description="Base64 Ed25519 key that checks the log's seals.")


@router.get(
    "",
    response_model=list[AuditRecordOut],
    responses=_ERRORS,
    summary="Query your tenant's audit records, oldest first",
)
async def query_audit(
    caller: Caller,
    request: Request,
    actor: Annotated[str | None, Query(description="Key id.")] = None,
    action: Annotated[
        str | None, Query(description="Exact, or a prefix ending with '.' (proposal.).")
    ] = None,
    target: Annotated[str | None, Query(description="e.g. sandbox:sb…")] = None,
    since: Annotated[datetime | None, Query(description="From (inclusive), RFC 3339.")] = None,
    until: Annotated[datetime | None, Query(description="Until (exclusive), RFC 3339.")] = None,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="Only records after this seq (paging).")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    if caller.role is Role.AGENT:
        raise Forbidden("agent keys cannot read the audit log (approver or admin keys can)")
    query = AuditQuery(caller.tenant, actor, action, target, since, until, after, limit)
    return [record.to_json() for record in await deps.audit(request).query(query)]


@router.get("/public-key", response_model=PublicKey, summary="The key that checks the seals")
async def public_key(caller: Caller, request: Request) -> PublicKey:
    """Pin it for ``ringfence audit verify --public-key``."""
    return PublicKey(public_key=deps.audit(request).public_key)
