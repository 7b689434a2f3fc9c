"""The JSON shapes of E2B's control plane, as its SDKs send and parse them.

Field names are E2B's (camelCase, and ``allow_internet_access`` as it is). Requests ignore
fields this server does not know (newer SDKs add some); the ones it knows but cannot honour
are refused by the routes, never silently dropped.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ringfence.models import MAX_TIMEOUT_SECONDS, Sandbox

__all__ = [
    "ENVD_VERSION",
    "AutoResume",
    "ConnectRequest",
    "E2bSandbox",
    "Lifecycle",
    "ListedSandbox",
    "NewSandbox",
    "SandboxDetail",
    "TimeoutRequest",
    "e2b_template",
    "listed",
]

# The envd version this server speaks. At 0.6.4 no SDK feature gate trips (default user,
# stdin, octet-stream and gzip uploads, watch options); the sandbox daemon serves them all.
ENVD_VERSION = "0.6.4"
CLIENT_ID = "ringfence"


class AutoResume(BaseModel):
    """``autoResume`` of a create: whether a request to it while paused resumes it."""

    model_config = ConfigDict(extra="ignore")

    enabled: bool = False


class NewSandbox(BaseModel):
    """``POST /v2/sandboxes``."""

    model_config = ConfigDict(extra="ignore")

    templateID: str = Field(max_length=128)
    timeout: int | None = Field(None, gt=0, le=int(MAX_TIMEOUT_SECONDS))
    metadata: dict[str, str] | None = None
    envVars: dict[str, str] | None = None
    autoPause: bool | None = None  # on_timeout "pause" (server.e2b.state maps the lifecycle)
    autoPauseMemory: bool | None = None
    autoResume: AutoResume | None = None
    allow_internet_access: bool | None = None
    mcp: dict[str, Any] | None = None
    network: dict[str, Any] | None = None
    iam: dict[str, Any] | None = None
    volumeMounts: list[dict[str, Any]] | None = None


class ConnectRequest(BaseModel):
    """``POST /v2/sandboxes/{id}/connect`` (and v1's ``/resume``). ``memory`` false: a
    paused sandbox comes back cold, from its files (E2B's ``on_resume="reboot"``)."""

    model_config = ConfigDict(extra="ignore")

    timeout: int | None = Field(None, gt=0, le=int(MAX_TIMEOUT_SECONDS))
    memory: bool | None = None
    autoPause: bool | None = None  # v1's resume only


class TimeoutRequest(BaseModel):
    """``POST /sandboxes/{id}/timeout``."""

    model_config = ConfigDict(extra="ignore")

    timeout: int = Field(gt=0, le=int(MAX_TIMEOUT_SECONDS))


class E2bSandbox(BaseModel):
    """What create and connect answer: where the sandbox is and its access tokens."""

    templateID: str
    sandboxID: str
    clientID: str = CLIENT_ID
    envdVersion: str = ENVD_VERSION
    envdAccessToken: str
    trafficAccessToken: str
    domain: str | None = None


class ListedSandbox(BaseModel):
    """One item of ``GET /v2/sandboxes``."""

    templateID: str
    sandboxID: str
    clientID: str = CLIENT_ID
    startedAt: datetime
    endAt: datetime
    envdVersion: str = ENVD_VERSION
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    state: str = "running"
    metadata: dict[str, str]
    volumeMounts: list[dict[str, str]] = Field(default_factory=list)  # [{name, path}]


class Lifecycle(BaseModel):
    """What its timeout does and whether a request resumes it when paused (E2B's names)."""

    autoResume: bool
    onTimeout: str


class SandboxDetail(ListedSandbox):
    """``GET /sandboxes/{id}``."""

    envdAccessToken: str | None = None
    lifecycle: Lifecycle | None = None


def e2b_template(sandbox: Sandbox) -> str:
    """Its E2B template id: the snapshot it started from (a snapshot is a template in
    E2B's terms), else its template."""
    return sandbox.snapshot or sandbox.template


def listed(sandbox: Sandbox) -> dict[str, Any]:
    """The E2B fields of a running or paused Ringfence sandbox (ListedSandbox's). A paused
    one's ``endAt`` is when it was paused (its timeout clock stops while paused)."""
    limits = sandbox.limits
    end = sandbox.expires_at or sandbox.paused_at or sandbox.ended_at or sandbox.created_at
    return {
        "templateID": e2b_template(sandbox),
        "sandboxID": sandbox.id,
        "startedAt": sandbox.created_at,
        "endAt": end,
        "state": sandbox.state.value,
        "cpuCount": max(1, math.ceil(limits.cpus or 1)),
        "memoryMB": (limits.memory or 0) >> 20,
        "diskSizeMB": (limits.disk or 0) >> 20,
        "metadata": sandbox.metadata,
        "volumeMounts": [{"name": m.name, "path": m.path} for m in sandbox.volumes],
    }
