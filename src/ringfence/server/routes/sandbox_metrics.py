"""What a sandbox uses, on the native API (``GET /v1/sandboxes/{id}/metrics``), and the
server-wide series of the Prometheus endpoint (``prometheus_lines``, served by ``meta``).
The readings are the service's (``service.usage``)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ringfence.models import SandboxMetrics
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody
from ringfence.server.routes.sandboxes import SandboxId
from ringfence.service.usage import BUCKETS, UsageTotals

__all__ = ["prometheus_lines", "router"]

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"])

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request (a malformed id)"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such sandbox in your tenant"},
    409: {
        "model": ErrorBody,
        "description": "The sandbox has ended, or is paused to disk (sandbox_not_running)",
    },
    421: {
        "model": ErrorBody,
        "description": "Another server replica runs the sandbox (sandbox_on_another_replica)",
    },
    503: {
        "model": ErrorBody,
        "description": "This server's backend cannot measure sandboxes; the message says "
        "why (backend_unavailable)",
    },
}


@router.get(
    "/{sandbox_id}/metrics",
    response_model=SandboxMetrics,
    responses=_ERRORS,
    summary="What the sandbox uses now: CPU, memory, disk, processes",
)
async def sandbox_metrics(
    sandbox_id: SandboxId, caller: Caller, request: Request
) -> SandboxMetrics:
    """Read from its cgroup and volume now (a paused sandbox is read as it is, never
    resumed). CPU percent is over the time since the previous read of this sandbox when
    that is recent, else over a quarter of a second (the answer waits for it)."""
    return await deps.sandboxes(request).usage.now(caller.tenant, sandbox_id)


def prometheus_lines(totals: UsageTotals) -> list[str]:
    """The usage series: sums over the running sandboxes, and counts of sandboxes by the
    fraction of each limit they use (``le``: at most that fraction; cumulative). A fixed
    set of series: no sandbox's or tenant's name is a label."""
    lines: list[str] = []
    for name, kind, help_text, value in (
        ("sandboxes_measured", "gauge", "Running sandboxes whose usage was read.",
         totals.sandboxes),
        ("sandboxes_unmeasured", "gauge", "Running sandboxes whose backend cannot be read.",
         totals.unmeasured),
        ("sandboxes_cpu_cores", "gauge",
         "CPU cores the sandboxes used since the previous scrape (new ones count from their "
         "first scrape).", round(totals.cpu_cores, 4)),
        ("sandboxes_memory_bytes", "gauge", "Memory charged to the sandboxes.",
         totals.memory_bytes),
        ("sandboxes_disk_bytes", "gauge", "Bytes of the sandboxes' writable files.",
         totals.disk_bytes),
        ("sandboxes_pids", "gauge", "Processes and threads in the sandboxes.", totals.pids),
    ):  # fmt: skip
        lines += [
            f"# HELP ringfence_{name} {help_text}",
            f"# TYPE ringfence_{name} {kind}",
            f"ringfence_{name} {value}",
        ]
    for name, counts in (
        ("cpu", totals.cpu_use),
        ("memory", totals.memory_use),
        ("disk", totals.disk_use),
    ):
        series = f"ringfence_sandboxes_{name}_use"
        lines += [
            f"# HELP {series} Sandboxes using at most the fraction le of their {name} limit "
            "(no limit counts as 0).",
            f"# TYPE {series} gauge",
        ]
        lines += [f'{series}{{le="{b}"}} {c}' for b, c in zip(BUCKETS, counts, strict=True)]
        lines.append(f'{series}{{le="+Inf"}} {totals.sandboxes}')
    return lines
