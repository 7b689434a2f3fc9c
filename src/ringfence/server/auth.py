"""Who is calling: the API key from ``Authorization: Bearer`` or ``X-API-Key``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from ringfence.server import deps
from ringfence.server.connections import authenticated
from ringfence.service.keys import Principal

__all__ = ["Caller"]

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <Ringfence key>")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="The Ringfence key")


async def _caller(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    header: Annotated[str | None, Depends(_header)],
) -> Principal:
    presented = bearer.credentials if bearer else header
    principal = await deps.keys(request).authenticate(presented)
    authenticated()  # its connection may idle as long as keep-alive allows
    return principal


Caller = Annotated[Principal, Depends(_caller)]
