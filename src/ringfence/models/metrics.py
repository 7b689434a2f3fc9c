"""What a sandbox uses: one sample of its CPU, memory, disk and processes (the native
API's ``/v1/sandboxes/{id}/metrics``, the SDK's ``metrics()``, ``ringfence sandbox top``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SandboxMetrics"]


class SandboxMetrics(BaseModel):
    """One sample of a running sandbox's use, read from its cgroup and volume when asked.
    A limit of 0 means none is set (or this backend cannot say)."""

    model_config = ConfigDict(frozen=True)

    sandbox_id: str = Field(description="The sandbox measured.")
    timestamp: datetime = Field(description="When it was read (UTC).")
    cpu_seconds: float = Field(
        description="CPU time its processes used since it started (or resumed), in seconds."
    )
    cpu_percent: float = Field(
        description="Its CPU use over the last moments, in percent of its CPU limit (100: "
        "every core it may use is busy); measured over the time since the previous sample "
        "of it, or over a short window when there is none recent."
    )
    cpus: float = Field(description="Its CPU limit, in cores.")
    memory_bytes: int = Field(
        description="Memory charged to it now, without page cache the kernel can drop at "
        "once (files written to its tmpfs count: they live in memory)."
    )
    memory_cache_bytes: int = Field(0, description="Of the memory charged, the page cache.")
    memory_limit: int = Field(description="Its memory limit, in bytes.")
    disk_bytes: int = Field(description="Bytes its writable files use (not its checkpoints).")
    disk_limit: int = Field(description="Its disk limit, in bytes.")
    pids: int = Field(description="Processes and threads alive in it now.")
