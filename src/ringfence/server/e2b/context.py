"""What the E2B routes work with: the service layer (sandboxes, keys) and the access tokens."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from ringfence.server import deps
from ringfence.server.e2b.tokens import Grants
from ringfence.service.keys import Keys
from ringfence.service.sandboxes import SandboxService

__all__ = ["E2bContext", "context_of"]


@dataclass(frozen=True)
class E2bContext:
    keys: Keys
    sandboxes: SandboxService
    grants: Grants


def context_of(request: Request) -> E2bContext:
    return deps.e2b(request)
