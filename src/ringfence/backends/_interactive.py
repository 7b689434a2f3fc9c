"""What a backend offers for interactive sandboxes: a runtime that starts the sandbox
daemon, and a handle on each running sandbox. The service layer depends on these
protocols only (``LocalSandboxRuntime`` implements them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ringfence.models import ExecutionResult, NetworkPolicy, ResourceLimits

__all__ = ["LaunchSpec", "LiveSandbox", "SandboxRuntime"]


@dataclass(frozen=True)
class LaunchSpec:
    """What the runtime needs to start one interactive sandbox (policy already checked)."""

    image: str
    env: dict[str, str]
    limits: ResourceLimits
    timeout: float
    network: NetworkPolicy | None = None  # egress policy; None: no network


class LiveSandbox(Protocol):
    """A running sandbox. Its end is an ``ExecutionResult`` of the daemon's execution:
    cancelled (killed), timed out (expired), or anything else (it died by itself)."""

    @property
    def socket_path(self) -> Path:
        """Where the control plane reaches the daemon (HTTP over a unix socket)."""
        ...

    @property
    def running(self) -> bool:
        """False once it has ended."""
        ...

    async def set_timeout(self, seconds: float) -> None:
        """Kill the sandbox ``seconds`` from now instead of at its earlier deadline."""
        ...

    async def kill(self) -> ExecutionResult:
        """Kill every process and wait until nothing of the sandbox remains."""
        ...

    async def ended(self) -> ExecutionResult:
        """Wait for the end, whatever causes it; nothing of the sandbox remains then."""
        ...


class SandboxRuntime(Protocol):
    async def start(self, spec: LaunchSpec) -> LiveSandbox:
        """Start a sandbox running the daemon.

        Raises:
            SandboxError: it could not be set up (the message says why).
        """
        ...

    async def aclose(self) -> None:
        """Kill every sandbox it started."""
        ...
