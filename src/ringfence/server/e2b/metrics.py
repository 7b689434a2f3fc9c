"""E2B's ``get_metrics(start, end)`` (``GET /sandboxes/{id}/metrics``) onto the native
readings (``service.usage``): the samples of the sandbox between ``start`` and ``end``
(unix seconds), oldest first, with one taken now. The first ask returns that one; from
then on the sandbox is sampled every 5 seconds for 10 minutes after the last ask (E2B's
cadence), so a later call returns the samples since. A sandbox paused to disk has no
processes to measure: an empty list. An ended or unknown one is 404."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse

from ringfence.errors import InvalidRequest, SandboxNotRunning
from ringfence.models import SandboxMetrics, SandboxState
from ringfence.server.e2b.context import caller, gone

__all__ = ["e2b_metric", "router"]

router = APIRouter()

SandboxId = Annotated[str, Path(max_length=64)]
ApiKey = Annotated[str | None, Header(alias="X-API-KEY")]
_MAX_UNIX = 253402300799  # 9999-12-31: beyond it a datetime cannot be made


def e2b_metric(sample: SandboxMetrics) -> dict[str, object]:
    """One sample in E2B's shape (its SDK's ``SandboxMetric``): CPU percent of the
    sandbox's cores, whole cores (at least 1), bytes."""
    return {
        "timestamp": sample.timestamp.isoformat().replace("+00:00", "Z"),
        "timestampUnix": int(sample.timestamp.timestamp()),
        "cpuCount": max(1, math.ceil(sample.cpus)),
        "cpuUsedPct": sample.cpu_percent,
        "memUsed": sample.memory_bytes,
        "memTotal": sample.memory_limit,
        "memCache": sample.memory_cache_bytes,
        "diskUsed": sample.disk_bytes,
        "diskTotal": sample.disk_limit,
    }


def _instant(seconds: int | None, name: str) -> datetime | None:
    if seconds is None:
        return None
    if not 0 <= seconds <= _MAX_UNIX:
        raise InvalidRequest(f"{name} must be unix seconds between 0 and {_MAX_UNIX}")
    return datetime.fromtimestamp(seconds, UTC)


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics(
    sandbox_id: SandboxId,
    request: Request,
    start: Annotated[int | None, Query()] = None,
    end: Annotated[int | None, Query()] = None,
    x_api_key: ApiKey = None,
) -> JSONResponse:
    context, principal = await caller(request, x_api_key)
    since, until = _instant(start, "start"), _instant(end, "end")
    if until is not None:  # whole seconds: a sample within the end's second is in it
        until = until.replace(microsecond=999_999)
    sandbox = await context.sandboxes.get(principal.tenant, sandbox_id)
    if sandbox.state not in (SandboxState.RUNNING, SandboxState.PAUSED):
        raise gone(sandbox_id)
    try:
        samples = await context.sandboxes.usage.history(principal.tenant, sandbox_id, since, until)
    except SandboxNotRunning:
        if sandbox.state is SandboxState.PAUSED:  # to disk: nothing runs to be measured
            return JSONResponse([])
        raise gone(sandbox_id) from None
    return JSONResponse([e2b_metric(s) for s in samples])
