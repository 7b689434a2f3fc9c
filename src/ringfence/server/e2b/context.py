"""What the E2B routes work with: the service layer (sandboxes, keys) and the access tokens,
and the helpers every control-plane route shares (who calls, what a sandbox answers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from ringfence.errors import SandboxNotFound
from ringfence.models import Sandbox
from ringfence.server import deps
from ringfence.server.connections import authenticated
from ringfence.server.e2b.models import E2bSandbox, e2b_template
from ringfence.server.e2b.tokens import Grant, Grants, Purpose
from ringfence.service.keys import Keys, Principal
from ringfence.service.sandboxes import SandboxService

__all__ = ["E2bContext", "Sweep", "answer", "caller", "context_of", "gone"]


@dataclass
class Sweep:
    """What the last sweep of ended sandboxes' grants kept (``control``): paused sandboxes
    keep theirs, so the next sweep waits until the grants have doubled since."""

    kept: int = 0


@dataclass(frozen=True)
class E2bContext:
    keys: Keys
    sandboxes: SandboxService
    grants: Grants
    sweep: Sweep = field(default_factory=Sweep)


def context_of(request: Request) -> E2bContext:
    return deps.e2b(request)


async def caller(request: Request, key: str | None) -> tuple[E2bContext, Principal]:
    """The context and the principal of ``X-API-KEY``. Raises ``Unauthenticated``."""
    context = context_of(request)
    principal = await context.keys.authenticate(key)
    authenticated()  # its connection may idle as long as keep-alive allows
    return context, principal


def answer(context: E2bContext, principal: Principal, sandbox: Sandbox) -> E2bSandbox:
    """What create, connect and fork answer: the sandbox, with the calling key's tokens."""
    grant = Grant(principal.tenant, principal.key_id, principal.generation, sandbox.id)
    return E2bSandbox(
        templateID=e2b_template(sandbox),
        sandboxID=sandbox.id,
        envdAccessToken=context.grants.token(grant, Purpose.ENVD),
        trafficAccessToken=context.grants.token(grant, Purpose.TRAFFIC),
        domain=context.sandboxes.config.ports_domain,  # get_host(port): docs/ports.md
    )


def gone(sandbox_id: str) -> SandboxNotFound:
    return SandboxNotFound(f"sandbox {sandbox_id} was not found (it has ended)")
