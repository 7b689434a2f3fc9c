"""Interactive sandboxes: what to create, their lifecycle, and how the API shows them."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticSerializationError

from ringfence.models._fields import ENV_BOUNDS, MAX_TIMEOUT_SECONDS, Env, checked_env
from ringfence.models.limits import ResourceLimits, SandboxLimits
from ringfence.models.network import NetworkPolicy
from ringfence.models.workstation import GROUP_PATTERN, ProjectMount, VolumeMount

__all__ = ["OnTimeout", "Sandbox", "SandboxSpec", "SandboxState"]


def _sandbox_limits(value: object) -> object:
    # Limits built as ResourceLimits (the SDK's, MCP's) are checked against the floors here.
    if isinstance(value, ResourceLimits) and not isinstance(value, SandboxLimits):
        return value.model_dump(exclude_none=True)
    return value


class SandboxState(StrEnum):
    """The lifecycle of an interactive sandbox. The strings are API: they never change."""

    RUNNING = "running"  # its daemon serves commands and files
    PAUSED = "paused"  # stopped (memory held) or saved to disk; any request resumes it
    KILLED = "killed"  # kill() was called; nothing of it remains
    EXPIRED = "expired"  # its timeout passed; nothing of it remains
    FAILED = "failed"  # it died by itself, or with a server restart (see error)

    @property
    def is_terminal(self) -> bool:
        return self not in (SandboxState.RUNNING, SandboxState.PAUSED)


_TEMPLATE = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
_SNAPSHOT_ID = r"^sn[0-9a-f]{20}$"  # models.snapshots.SNAPSHOT_ID
OnTimeout = Literal["kill", "pause"]
_MAX_METADATA = 64


class SandboxSpec(BaseModel):
    """What to create: an interactive sandbox, alive until its timeout or a kill."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    template: str = Field(
        "base",
        pattern=_TEMPLATE,
        description="Root filesystem of the sandbox. 'base': a read-only view of the host's "
        "system directories (python3, a shell and the usual tools).",
    )
    timeout: float | None = Field(
        None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="Seconds until the sandbox is killed, from now (at least 1: it must "
        "outlive its own start); default 300. set_timeout moves it.",
    )
    env: Env = Field(
        default_factory=dict,
        description="Environment variables of every command in the sandbox (over PATH, HOME, "
        "USER, LOGNAME, LANG and TERM defaults). Never returned by the API." + ENV_BOUNDS,
    )
    metadata: Annotated[
        dict[
            Annotated[str, Field(min_length=1, max_length=128)],
            Annotated[str, Field(max_length=1024)],
        ],
        Field(max_length=_MAX_METADATA),
    ] = Field(
        default_factory=dict,
        description="Your own labels, returned with the sandbox and usable as list filters "
        "(at most 64; keys of 1-128 characters, values of at most 1024).",
    )
    limits: Annotated[SandboxLimits, BeforeValidator(_sandbox_limits)] = Field(
        default_factory=SandboxLimits,
        description="Limits on the whole sandbox (every command together); unset fields default.",
    )
    network: NetworkPolicy | None = Field(
        None,
        description="Egress policy; default the tenant's default, else none (loopback only). "
        "Changed later only through the API.",
    )
    snapshot: str | None = Field(
        None,
        pattern=_SNAPSHOT_ID,
        description="Start from this snapshot of yours (its files; processes start fresh) "
        "instead of the template's files alone; the template is the snapshot's.",
    )
    auto_pause: float | None = Field(
        None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="Seconds without a request after which the sandbox is paused to disk "
        "(memory freed, files kept) instead of left running; default never.",
    )
    on_timeout: OnTimeout = Field(
        "kill",
        description="What its timeout does: 'kill' (nothing of it remains) or 'pause' (to "
        "disk, as auto_pause does; E2B's lifecycle on_timeout).",
    )
    auto_resume: bool = Field(
        True,
        description="Whether a request to it while paused resumes it (else the request is "
        "refused until resume is called).",
    )
    volumes: list[VolumeMount] = Field(
        default_factory=list,
        max_length=16,
        description="Named volumes of yours to mount (they outlive the sandbox).",
    )
    project: ProjectMount | None = Field(
        None,
        description="A host directory shown as a copy-on-write view (diff and sync read and "
        "apply the sandbox's changes); only under the operator's project roots.",
    )
    group: str | None = Field(
        None,
        pattern=GROUP_PATTERN,
        description="Network group: sandboxes of yours in one group reach each other's ports; "
        "default none (no sandbox reaches it).",
    )
    public_traffic: bool = Field(
        False,
        description="Let anyone with its port URL reach its ports (default: the sandbox's "
        "traffic token or a key of yours is needed).",
    )

    @field_validator("env")
    @classmethod
    def _valid_env(cls, env: dict[str, str]) -> dict[str, str]:
        return checked_env(env)

    @model_validator(mode="after")
    def _distinct_paths(self) -> SandboxSpec:
        paths = [volume.path for volume in self.volumes]
        if self.project is not None:
            paths.append(self.project.path)
        for index, path in enumerate(paths):
            for other in paths[index + 1 :]:
                if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
                    raise ValueError(f"two mounts overlap: {path!r} and {other!r}")
        return self

    @model_validator(mode="after")
    def _valid_unicode(self) -> SandboxSpec:
        try:
            self.model_dump_json()
        except PydanticSerializationError:
            raise ValueError("text must be valid Unicode (no lone surrogates)") from None
        return self


class Sandbox(BaseModel):
    """An interactive sandbox as the API shows it (its environment is never shown)."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Unique among every tenant's sandboxes.")
    template: str
    state: SandboxState
    metadata: dict[str, str] = Field(default_factory=dict)
    limits: ResourceLimits = Field(description="The limits in force (defaults filled in).")
    network: NetworkPolicy = Field(
        default_factory=NetworkPolicy,
        description="The egress policy in force (header values hidden).",
    )
    created_at: datetime
    expires_at: datetime | None = Field(
        description="When it will be killed (or paused, with on_timeout 'pause') unless "
        "set_timeout moves it; None once ended, and while paused (see timeout_left)."
    )
    ended_at: datetime | None = None
    error: str | None = Field(
        None, description="Why it failed, in plain words (for the failed state)."
    )
    paused_at: datetime | None = Field(None, description="When it was paused (while paused).")
    memory: bool | None = Field(
        None,
        description="While paused: true, its processes are stopped with their memory held "
        "(they go on where they were); false, only its files are kept (its processes start "
        "again on resume).",
    )
    timeout_left: float | None = Field(
        None,
        description="While paused: seconds of its timeout left (the clock stops while paused).",
    )
    auto_pause: float | None = Field(None, description="Idle seconds before it is paused.")
    on_timeout: OnTimeout = "kill"
    auto_resume: bool = True
    snapshot: str | None = Field(None, description="The snapshot it started from, if any.")
    volumes: list[VolumeMount] = Field(default_factory=list)
    project: ProjectMount | None = None
    group: str | None = None
    public_traffic: bool = False

    def ended(self, state: SandboxState, error: str | None = None) -> Sandbox:
        """This sandbox, ended now in ``state`` (a terminal one)."""
        assert state.is_terminal, state
        update = {"state": state, "error": error, "ended_at": datetime.now(UTC), "expires_at": None}
        return self.model_copy(update=update)
