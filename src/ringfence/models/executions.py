"""Executions: one command run once in a fresh sandbox, its lifecycle, and what came out."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticSerializationError

from ringfence.models._fields import (
    ARGV_BOUNDS,
    ENV_BOUNDS,
    ID_PATTERN,
    MAX_ARGV_BYTES,
    MAX_TIMEOUT_SECONDS,
    PROGRAM_FIRST,
    Env,
    Word,
    checked_env,
)
from ringfence.models.limits import ResourceLimits
from ringfence.models.mounts import Mount
from ringfence.models.network import NetworkPolicy

__all__ = ["ExecutionRecord", "ExecutionRequest", "ExecutionResult", "Status", "advance"]


class Status(StrEnum):
    """The lifecycle of an execution. The strings are API: they never change."""

    PENDING = "pending"  # accepted, the sandbox is being set up
    RUNNING = "running"  # the command runs inside its sandbox
    SUCCEEDED = "succeeded"  # the command exited with status 0
    FAILED = "failed"  # non-zero exit, out of memory, or a system failure (see error)
    TIMED_OUT = "timed_out"  # the deadline passed; the whole process tree was killed
    CANCELLED = "cancelled"  # cancel() was called; the whole process tree was killed

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED})
_NEXT: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.RUNNING, Status.FAILED, Status.CANCELLED}),
    Status.RUNNING: _TERMINAL,
}


def advance(current: Status, new: Status) -> Status:
    """Return ``new`` if an execution may move from ``current`` to it.

    Raises:
        ValueError: the move is illegal (for example out of a terminal state).
    """
    if new not in _NEXT.get(current, frozenset()):
        raise ValueError(f"an execution cannot go from {current.value} to {new.value}")
    return new


class ExecutionRequest(BaseModel):
    """One command to run once in a fresh sandbox (the founding design's request)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(
        default_factory=lambda: uuid.uuid4().hex,
        pattern=ID_PATTERN,
        description="Execution id, unique; generated when left out.",
    )
    session_id: str | None = Field(None, max_length=256, description="Agent session id.")
    task_id: str | None = Field(None, max_length=256, description="Task id within the session.")
    checkpoint_id: str | None = Field(
        None, max_length=256, description="Approval checkpoint this execution was approved at."
    )
    namespace: str | None = Field(
        None, max_length=63, description="Sandbox namespace (Kubernetes); default from Config."
    )
    target_namespace: str | None = Field(
        None, max_length=63, description="Namespace the remediation acts on (Kubernetes)."
    )
    image: str | None = Field(
        None,
        description="What the root filesystem is: 'host' (a read-only view of the host's system "
        "directories) or an absolute path to a directory root filesystem; default from Config.",
    )
    command: Annotated[list[Word], Field(json_schema_extra=PROGRAM_FIRST)] = Field(
        min_length=1,
        max_length=1024,
        description="Program (not empty) and leading arguments." + ARGV_BOUNDS,
    )
    args: list[Word] = Field(
        default_factory=list, max_length=3072, description="Further arguments."
    )
    env: Env = Field(
        default_factory=dict,
        description="The only environment variables set in the sandbox, besides PATH, HOME, "
        "USER, LOGNAME, LANG and TERM defaults that these override." + ENV_BOUNDS,
    )
    cwd: str | None = Field(
        None,
        max_length=4095,
        pattern=r"^/[^\x00]*$",
        description="Working directory inside the sandbox (absolute); default the workspace.",
    )
    timeout: float | None = Field(
        None,
        gt=0,
        le=MAX_TIMEOUT_SECONDS,
        description="Wall-clock limit in seconds; default from Config.",
    )
    approved_by: str | None = Field(None, max_length=256, description="Who approved it.")
    remediation_action: str | None = Field(
        None, max_length=1024, description="Name of the remediation this carries out."
    )
    limits: ResourceLimits = Field(
        default_factory=ResourceLimits, description="Resource limits; unset fields default."
    )
    mounts: list[Mount] = Field(
        default_factory=list, max_length=64, description="Host paths granted to the sandbox."
    )
    network: NetworkPolicy | None = Field(
        None,
        description="Egress policy; default the tenant's default, else none.",
        # Left out when unset, so a request serializes (and hashes: proposals' digests) as
        # it did before policies existed.
        exclude_if=lambda network: network is None,
    )

    @field_validator("command")
    @classmethod
    def _a_program(cls, words: list[str]) -> list[str]:
        if words and words[0] == "":
            raise ValueError("the program (the command's first word) must not be empty")
        return words

    @model_validator(mode="after")
    def _argv_fits(self) -> ExecutionRequest:
        size = sum(len(word) + 1 for word in self.argv)
        if size > MAX_ARGV_BYTES:
            raise ValueError(f"command and args are {size} characters, more than {MAX_ARGV_BYTES}")
        return self

    @field_validator("env")
    @classmethod
    def _valid_env(cls, env: dict[str, str]) -> dict[str, str]:
        return checked_env(env)

    @model_validator(mode="after")
    def _valid_unicode(self) -> ExecutionRequest:
        try:
            self.model_dump_json()
        except PydanticSerializationError:
            raise ValueError("text must be valid Unicode (no lone surrogates)") from None
        return self

    @model_validator(mode="after")
    def _distinct_targets(self) -> ExecutionRequest:
        targets = [m.target for m in self.mounts]
        if len(set(targets)) != len(targets):
            raise ValueError("two mounts share a sandbox path")
        return self

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]


class ExecutionResult(BaseModel):
    """What became of an execution; ``get_status`` returns it while running too."""

    model_config = ConfigDict(frozen=True)

    execution_id: str
    status: Status
    exit_code: int | None = Field(
        None,
        description="The command's exit status; None while running, or when it was "
        "killed for its deadline or a cancel, or never started.",
    )
    logs: str = Field("", description="stdout and stderr interleaved in order, bounded.")
    logs_truncated: bool = Field(
        False, description="True when the middle of the output was cut (a marker says where)."
    )
    job_name: str | None = Field(None, description="Name of the sandbox or Job that ran it.")
    backend: str | None = Field(None, description="The backend that ran it.")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = Field(
        None, description="A system failure or cause of death in plain words, e.g. 'out of memory'."
    )


@dataclass(frozen=True)
class ExecutionRecord:
    """An execution as the store keeps it: ``id`` is the tenant's own id for it."""

    tenant: str
    id: str
    request: ExecutionRequest
    result: ExecutionResult
    created_at: datetime
    updated_at: datetime
