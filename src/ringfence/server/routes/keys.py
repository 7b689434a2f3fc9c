"""``/v1/keys``: your tenant's API keys, for admins: list, revoke, rotate. No answer ever
carries a key's secret or its digest, except the new key a rotation returns, once."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from ringfence.errors import Forbidden
from ringfence.models import ApiKey, Role
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody
from ringfence.service.keys import Principal

__all__ = ["router"]

router = APIRouter(prefix="/v1/keys", tags=["keys"])

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "Missing, invalid or revoked API key"},
    403: {"model": ErrorBody, "description": "Only admin keys manage keys"},
}
_ONE_KEY: dict[int | str, dict[str, object]] = {
    **_ERRORS,
    404: {"model": ErrorBody, "description": "No key with this id in your tenant"},
}
_KeyId = Path(description="The key's id (the 16 hex digits after rf_).", max_length=64)


class KeyOut(BaseModel):
    """A key as admins see it: never its secret, nor the secret's digest."""

    id: str = Field(description="The key id: what audit records name as the actor.")
    tenant: str
    role: Role
    name: str = Field(description="Who or what holds it, given at creation ('' for none).")
    description: str
    created_at: datetime
    rotated_at: datetime | None = Field(description="When its secret was last replaced.")
    revoked_at: datetime | None = Field(description="Since when it is refused everywhere.")
    revoked: bool

    @classmethod
    def of(cls, key: ApiKey) -> KeyOut:
        return cls(
            id=key.key_id, tenant=key.tenant, role=key.role, name=key.name,
            description=key.description, created_at=key.created_at,
            rotated_at=key.rotated_at, revoked_at=key.revoked_at, revoked=key.revoked,
        )  # fmt: skip


class RotatedKeyOut(KeyOut):
    api_key: str = Field(
        description="The new key (rf_<id>_<secret>), shown this once: only a digest is kept. "
        "The old secret is refused from now on (by every replica within 2 s)."
    )


def _admin(caller: Principal) -> Principal:
    if caller.role is not Role.ADMIN:
        raise Forbidden("only admin keys manage keys")
    return caller


@router.get(
    "", response_model=list[KeyOut], responses=_ERRORS, summary="Your tenant's keys, oldest first"
)
async def list_keys(caller: Caller, request: Request) -> list[KeyOut]:
    """Revoked keys included, for the record."""
    admin = _admin(caller)
    return [KeyOut.of(k) for k in await deps.keys(request).list_for(admin.tenant)]


@router.post(
    "/{key_id}/revoke",
    response_model=KeyOut,
    responses=_ONE_KEY,
    summary="Revoke a key for good",
)
async def revoke_key(caller: Caller, request: Request, key_id: str = _KeyId) -> KeyOut:
    """From now on the key is refused by every door (API, E2B, MCP, console sessions), by
    every replica within 2 s. Revoking a revoked key changes nothing."""
    admin = _admin(caller)
    revoked = await deps.keys(request).revoke(key_id, admin.key_id, admin.tenant)
    return KeyOut.of(revoked)


@router.post(
    "/{key_id}/rotate",
    response_model=RotatedKeyOut,
    responses={
        **_ONE_KEY,
        409: {"model": ErrorBody, "description": "The key is revoked: it stays revoked"},
    },
    summary="Give a key a new secret",
)
async def rotate_key(caller: Caller, request: Request, key_id: str = _KeyId) -> RotatedKeyOut:
    """The same id, name and role with a new secret, returned this once; the old secret is
    refused from now on, and console sessions signed in with it end."""
    admin = _admin(caller)
    rotated, api_key = await deps.keys(request).rotate(key_id, admin.key_id, admin.tenant)
    return RotatedKeyOut(**KeyOut.of(rotated).model_dump(), api_key=api_key)
