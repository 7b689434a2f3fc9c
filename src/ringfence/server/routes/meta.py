"""Health and identity."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from ringfence import __version__
from ringfence.server.auth import Caller
from ringfence.store import Role

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["meta"])


class Health(BaseModel):
    status: str
    version: str


class Identity(BaseModel):
    tenant: str
    role: Role
    key_id: str


@router.get("/health", response_model=Health, summary="Is the server up (no key needed)")
async def health() -> Health:
    return Health(status="ok", version=__version__)


@router.get("/whoami", response_model=Identity, summary="The tenant and role of your key")
async def whoami(caller: Caller) -> Identity:
    return Identity(tenant=caller.tenant, role=caller.role, key_id=caller.key_id)
