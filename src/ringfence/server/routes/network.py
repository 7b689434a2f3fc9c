"""``/v1/sandboxes/{id}/network``: a sandbox's egress policy, read and changed while it runs.

This API is the only way to change it: the policy lives in the Ringfence process, and
nothing inside the sandbox can reach this server (docs/network.md).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from ringfence.models import NetworkPolicy
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody
from ringfence.service.sandboxes import SandboxService

__all__ = ["router"]

router = APIRouter(prefix="/v1/sandboxes", tags=["network"])

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid policy, or a sandbox without network"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such sandbox in your tenant"},
    409: {"model": ErrorBody, "description": "The sandbox has ended (sandbox_not_running)"},
}

SandboxId = Annotated[str, Path(max_length=64, description="The sandbox's id.")]


def _service(request: Request) -> SandboxService:
    service: SandboxService = request.app.state.sandboxes
    return service


@router.get(
    "/{sandbox_id}/network",
    response_model=NetworkPolicy,
    responses=_ERRORS,
    summary="The sandbox's egress policy (header values hidden)",
)
async def get_network(sandbox_id: SandboxId, caller: Caller, request: Request) -> NetworkPolicy:
    return (await _service(request).get(caller.tenant, sandbox_id)).network


@router.put(
    "/{sandbox_id}/network",
    response_model=NetworkPolicy,
    responses=_ERRORS,
    summary="Replace the egress policy of a running sandbox",
)
async def set_network(
    sandbox_id: SandboxId, body: NetworkPolicy, caller: Caller, request: Request
) -> NetworkPolicy:
    """Connections opened from now on are decided by the new policy (open ones go on);
    answers already given to `ask` rules are kept. A sandbox created without network
    cannot be given one (400)."""
    changed = await _service(request).set_network(
        caller.tenant, sandbox_id, body, actor=caller.key_id
    )
    return changed.network
