"""Resource limits: of one execution's sandbox, and of an interactive sandbox (with floors)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ringfence._units import parse_size

__all__ = [
    "MIN_CPUS",
    "MIN_PIDS",
    "MIN_SANDBOX_MEMORY",
    "MIN_SANDBOX_PIDS",
    "ResourceLimits",
    "SandboxLimits",
]


def _size(value: object) -> object:
    if value is None or isinstance(value, (str, int)):
        return None if value is None else parse_size(value)
    return value


_Sized = BeforeValidator(_size)  # '256M' is accepted as well as bytes
_PIB = 1 << 50
# Measured floors: with pids 1 bubblewrap cannot fork the sandbox's init;
# below 0.01 cores the kernel refuses the CPU quota (1 ms per 100 ms period).
MIN_PIDS = 2
MIN_CPUS = 0.01
# An interactive sandbox runs its daemon (a process and a thread per call), a code kernel
# and the caller's commands: below 6 pids or 16 MiB the daemon or a first command failed.
# The floors are twice that.
MIN_SANDBOX_PIDS = 16
MIN_SANDBOX_MEMORY = 32 << 20


class ResourceLimits(BaseModel):
    """Limits on one sandbox. A field left out takes the default from ``Config``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory: Annotated[int, Field(ge=4 << 20, le=_PIB), _Sized] | None = Field(
        None,
        description="Memory limit in bytes (accepts '256M'). Exceeding it kills the command "
        "with the error 'out of memory'. Writable tmpfs contents count towards it.",
    )
    pids: int | None = Field(
        None, ge=MIN_PIDS, le=1_000_000, description="Most processes and threads alive at once."
    )
    cpus: float | None = Field(
        None,
        ge=MIN_CPUS,
        le=1024,
        description="CPU time as a number of cores (0.5 = half a core; at least 0.01).",
    )
    disk: Annotated[int, Field(ge=1 << 20, le=_PIB), _Sized] | None = Field(
        None,
        description="Size in bytes of each writable tmpfs (the workspace, /tmp, /dev/shm).",
    )

    def merged_over(self, defaults: ResourceLimits) -> ResourceLimits:
        """Return these limits with every unset field taken from ``defaults``."""
        given = self.model_dump(exclude_none=True)
        return defaults.model_copy(update=given)


class SandboxLimits(ResourceLimits):
    """The limits of an interactive sandbox: room for its daemon besides your commands."""

    memory: Annotated[int, Field(ge=MIN_SANDBOX_MEMORY, le=_PIB), _Sized] | None = Field(
        None,
        description="Memory limit in bytes (accepts '256M'; at least 32 MiB, the daemon's "
        "room). Exceeding it kills the command with the error 'out of memory'. Writable tmpfs "
        "contents count towards it.",
    )
    pids: int | None = Field(
        None,
        ge=MIN_SANDBOX_PIDS,
        le=1_000_000,
        description="Most processes and threads alive at once (at least 16: the daemon's "
        "count among them).",
    )
