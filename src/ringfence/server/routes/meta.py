"""Health and identity."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from ringfence import __version__
from ringfence.models import Role
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.routes.sandbox_metrics import prometheus_lines

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["meta"])


class Health(BaseModel):
    status: str
    version: str


class Identity(BaseModel):
    tenant: str
    role: Role
    key_id: str
    name: str = Field("", description="The name the key was created with ('' for none).")


@router.get("/health", response_model=Health, summary="Is the server up (no key needed)")
async def health() -> Health:
    return Health(status="ok", version=__version__)


@router.get("/whoami", response_model=Identity, summary="The tenant and role of your key")
async def whoami(caller: Caller) -> Identity:
    return Identity(tenant=caller.tenant, role=caller.role, key_id=caller.key_id, name=caller.name)


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    summary="Prometheus metrics: the pool, live sandboxes, what they use (no key needed)",
)
async def metrics(request: Request) -> str:
    """Counts only (no tenant's data): sandboxes alive on this server, and per template the
    pool's ready sandboxes, its target, and claims served from it (hits) or not (misses);
    what the running sandboxes use together, and how many use how much of their limits
    (each scrape reads every running sandbox once: a few small file reads each)."""
    sandboxes = deps.sandboxes(request)
    lines = [
        "# HELP ringfence_sandboxes_running Interactive sandboxes alive on this server.",
        "# TYPE ringfence_sandboxes_running gauge",
        f"ringfence_sandboxes_running {sandboxes.running_count()}",
    ]
    stats = sandboxes.pool_stats()
    for name, kind, help_text in (
        ("pool_ready", "gauge", "Sandboxes ready in the warm pool."),
        ("pool_target", "gauge", "Sandboxes the warm pool keeps ready."),
        ("pool_hits_total", "counter", "Creates served from the warm pool."),
        ("pool_misses_total", "counter", "Creates the warm pool could not serve."),
    ):
        lines += [f"# HELP ringfence_{name} {help_text}", f"# TYPE ringfence_{name} {kind}"]
        field = {"pool_ready": "size", "pool_target": "target"}.get(name, name.split("_")[1])
        lines += [
            f'ringfence_{name}{{template="{template}"}} {getattr(stat, field)}'
            for template, stat in sorted(stats.items())
        ]
    lines += prometheus_lines(await sandboxes.usage.totals())
    return "\n".join(lines) + "\n"
