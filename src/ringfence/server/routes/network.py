"""``/v1/sandboxes/{id}/network``: a sandbox's egress policy, read and changed while it runs.

This API is the only way to change it: the policy lives in the Ringfence process, and
nothing inside the sandbox can reach this server (docs/network.md).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from ringfence.models import NetworkPolicy
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody
from ringfence.service.egress_asks import EgressAsk

__all__ = ["router"]

router = APIRouter(tags=["network"])

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid policy, or a sandbox without network"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such sandbox in your tenant"},
    409: {"model": ErrorBody, "description": "The sandbox has ended (sandbox_not_running)"},
}

SandboxId = Annotated[str, Path(max_length=64, description="The sandbox's id.")]


@router.get(
    "/v1/sandboxes/{sandbox_id}/network",
    response_model=NetworkPolicy,
    responses=_ERRORS,
    summary="The sandbox's egress policy (header values hidden)",
)
async def get_network(sandbox_id: SandboxId, caller: Caller, request: Request) -> NetworkPolicy:
    return (await deps.sandboxes(request).get(caller.tenant, sandbox_id)).network


@router.put(
    "/v1/sandboxes/{sandbox_id}/network",
    response_model=NetworkPolicy,
    responses={
        **_ERRORS,
        421: {
            "model": ErrorBody,
            "description": "Another server replica runs the sandbox (sandbox_on_another_replica)",
        },
    },
    summary="Replace the egress policy of a running sandbox",
)
async def set_network(
    sandbox_id: SandboxId, body: NetworkPolicy, caller: Caller, request: Request
) -> NetworkPolicy:
    """Connections opened from now on are decided by the new policy (open ones go on);
    answers already given to `ask` rules are kept. A sandbox created without network
    cannot be given one (400)."""
    changed = await deps.sandboxes(request).set_network(
        caller.tenant, sandbox_id, body, actor=caller.key_id
    )
    return changed.network


# -- asks: "ask" rules waiting for a human ----------------------------------------------------

AskId = Annotated[str, Path(max_length=64, description="The ask's id.")]
_ASK_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    403: {"model": ErrorBody, "description": "Agent keys, or the key whose sandbox asked"},
    404: {"model": ErrorBody, "description": "No such ask in your tenant"},
    409: {"model": ErrorBody, "description": "Already decided, expired or abandoned"},
}


class AskDecision(BaseModel):
    reason: str = Field("", max_length=10_000, description="Why, for the audit record.")


@router.get(
    "/v1/network/asks",
    response_model=list[EgressAsk],
    responses=_ASK_ERRORS,
    summary="Egress asks of your tenant, newest first",
)
async def list_asks(
    caller: Caller,
    request: Request,
    pending: Annotated[bool, Query(description="Only the ones waiting for a decision.")] = False,
) -> list[EgressAsk]:
    return deps.asks(request).list(caller.tenant, pending_only=pending)


@router.post(
    "/v1/network/asks/{ask_id}/approve",
    response_model=EgressAsk,
    responses=_ASK_ERRORS,
    summary="Let the sandbox reach the destination (for its life)",
)
async def approve_ask(
    ask_id: AskId, body: AskDecision, caller: Caller, request: Request
) -> EgressAsk:
    return await deps.asks(request).decide(caller, ask_id, True, body.reason)


@router.post(
    "/v1/network/asks/{ask_id}/reject",
    response_model=EgressAsk,
    responses=_ASK_ERRORS,
    summary="Refuse the destination to the sandbox (for its life)",
)
async def reject_ask(
    ask_id: AskId, body: AskDecision, caller: Caller, request: Request
) -> EgressAsk:
    return await deps.asks(request).decide(caller, ask_id, False, body.reason)
