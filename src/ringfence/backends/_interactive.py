"""What a backend offers for interactive sandboxes: a runtime that starts the sandbox
daemon, and a handle on each running sandbox. The service layer depends on these
protocols only (``LocalSandboxRuntime`` implements them).

Sandbox state (docs/design.md, "Sandbox state"): a sandbox whose backend gives it a writable
layer can be checkpointed (its files: the workspace, ``/tmp`` and the root's upper layer),
rolled back in place, frozen (paused keeping its memory) and exported (a snapshot persisted
on the host's disk, from which ``SandboxRuntime.start`` starts a sandbox again: a resume
after a pause that freed memory, a fork's children, a template). A backend or host that
cannot do one of these raises ``StateUnsupported`` naming what is missing; ``state``
says up front what a sandbox supports.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from ringfence.errors import BackendUnavailable, StateUnsupported
from ringfence.models import ExecutionResult, NetworkPolicy, ResourceLimits

__all__ = [
    "BoundProject",
    "BoundVolume",
    "Checkpoint",
    "LaunchSpec",
    "LiveSandbox",
    "SandboxRuntime",
    "StateSupport",
    "Stateless",
    "Unmeasured",
    "Usage",
]


@dataclass(frozen=True)
class BoundVolume:
    """A tenant's volume as the runtime mounts it: ``source`` is its directory on the
    host (prepared by the service), shown at ``target`` owned by the sandbox's user for as
    long as it is mounted."""

    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class BoundProject:
    """A host directory shown at ``target`` as a copy-on-write view: reads see the host's
    files, writes land in the sandbox's own layer (``LiveSandbox.project_layer``)."""

    source: Path
    target: str


@dataclass(frozen=True)
class Usage:
    """What a sandbox consumes now, read from its cgroup and volume (cheap: a few small
    file reads; nothing is sampled for a sandbox nobody asks about)."""

    cpu_seconds: float  # CPU time used by all its processes since it started
    cpus: float  # its CPU limit, in cores
    memory_bytes: int  # memory in use now
    memory_limit: int
    disk_bytes: int  # bytes its writable files use
    disk_limit: int
    pids: int  # processes and threads now
    # Of ``memory_bytes``' charge, the page cache (the files a tmpfs holds count here too).
    memory_cache_bytes: int = 0


@dataclass(frozen=True)
class LaunchSpec:
    """What the runtime needs to start one interactive sandbox (policy already checked)."""

    image: str
    env: dict[str, str]
    limits: ResourceLimits
    timeout: float
    network: NetworkPolicy | None = None  # egress policy; None: no network
    # An exported snapshot (``LiveSandbox.export``) whose files the new sandbox starts
    # with: its seal is checked first, and a tampered or foreign one is refused
    # (``SandboxError``). None: the template's files only.
    restore: Path | None = None
    volumes: tuple[BoundVolume, ...] = ()
    project: BoundProject | None = None


@dataclass(frozen=True)
class StateSupport:
    """What a running sandbox's state can be captured with (each False names a reason
    in ``missing``)."""

    checkpoints: bool  # checkpoint, rollback and export of its files
    freeze: bool  # pause keeping memory (its processes stopped, nothing freed)
    memory: bool  # process memory in snapshots (CRIU); False: processes restart on restore
    missing: tuple[str, ...] = ()  # why a capability is absent, in plain words


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a sandbox's files: immutable, held on the host only."""

    id: str  # "ck" + hex, unique within the sandbox
    created_at: datetime
    files: int  # entries captured (files, directories, links)
    bytes: int  # bytes this checkpoint holds that no earlier one shares
    memory: bool = False  # process memory captured too (CRIU)


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
        """Kill every process and wait until nothing of the sandbox remains; a frozen
        sandbox's too, without letting them run first (a pause to disk relies on it)."""
        ...

    async def ended(self) -> ExecutionResult:
        """Wait for the end, whatever causes it; nothing of the sandbox remains then."""
        ...

    @property
    def state(self) -> StateSupport:
        """What this sandbox's state can be captured with."""
        ...

    @property
    def project_layer(self) -> Path | None:
        """The host directory holding what the sandbox wrote to its project view
        (``LaunchSpec.project``: an overlay's upper layer, read host-side by diff and sync,
        never through the sandbox); None when it has no project view or has ended."""
        ...

    async def checkpoint(self) -> Checkpoint:
        """Freeze, capture the files incrementally, thaw; processes keep running.

        Raises:
            StateUnsupported: no writable layer here.
            SnapshotBudgetExceeded: the sandbox's checkpoints are at their count or bytes.
            SandboxNotRunning: it has ended.
        """
        ...

    def checkpoints(self) -> list[Checkpoint]:
        """Its checkpoints, oldest first."""
        ...

    async def rollback(self, checkpoint_id: str) -> None:
        """Restore the files of ``checkpoint_id`` in place while frozen: content
        byte-identical, files made since removed, deleted ones back; processes survive.

        Raises:
            CheckpointNotFound: no such checkpoint of this sandbox.
            StateUnsupported, SandboxNotRunning: as for ``checkpoint``.
        """
        ...

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Free a checkpoint (its bytes go back to the budget). Raises
        ``CheckpointNotFound``."""
        ...

    async def freeze(self) -> None:
        """Stop every process of the sandbox where it is (its memory stays held).
        Raises ``StateUnsupported`` when the host has no freezer."""
        ...

    async def thaw(self) -> None:
        """Let a frozen sandbox run again (a no-op when it is not frozen)."""
        ...

    async def export(self, checkpoint_id: str, target: Path) -> None:
        """Persist ``checkpoint_id`` as a sealed snapshot in ``target`` (a directory that
        must not exist, on the host's disk, readable by the server only), for
        ``LaunchSpec.restore``. Raises ``CheckpointNotFound``, ``StateUnsupported``."""
        ...

    async def usage(self) -> Usage:
        """What it uses now, read when asked (a few small reads: nothing is sampled in
        the background). Zero limits mean none is set. A frozen sandbox is read too.

        Raises:
            SandboxNotRunning: it has ended.
            BackendUnavailable: this backend cannot measure it (the message says why).
        """
        ...


class SandboxRuntime(Protocol):
    async def start(self, spec: LaunchSpec) -> LiveSandbox:
        """Start a sandbox running the daemon (on ``spec.restore``'s files, if given).

        Raises:
            SandboxError: it could not be set up (the message says why), or
                ``spec.restore`` is not a snapshot this server sealed.
            StateUnsupported: ``spec.restore`` given, but this runtime cannot restore; or
                ``spec.volumes`` given, but it cannot mount volumes.
        """
        ...

    async def aclose(self) -> None:
        """Kill every sandbox it started."""
        ...


class Unmeasured:
    """``usage`` of a sandbox whose backend cannot measure it: refused with
    ``BackendUnavailable`` saying why (``unmeasured``)."""

    unmeasured = "this backend does not measure its sandboxes"

    async def usage(self) -> Usage:
        raise BackendUnavailable(f"the sandbox's usage cannot be read: {self.unmeasured}")


class Stateless:
    """The state methods of a sandbox whose backend captures no state: each refuses with
    ``StateUnsupported`` saying why (``reason``). A backend that can overrides them."""

    reason = "this backend gives sandboxes no writable layer to capture"

    @property
    def project_layer(self) -> Path | None:
        return None

    @property
    def state(self) -> StateSupport:
        return StateSupport(checkpoints=False, freeze=False, memory=False, missing=(self.reason,))

    def _unsupported(self) -> StateUnsupported:
        return StateUnsupported(f"sandbox state cannot be captured: {self.reason}")

    async def checkpoint(self) -> Checkpoint:
        raise self._unsupported()

    def checkpoints(self) -> list[Checkpoint]:
        return []

    async def rollback(self, checkpoint_id: str) -> None:
        raise self._unsupported()

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        raise self._unsupported()

    async def freeze(self) -> None:
        raise self._unsupported()

    async def thaw(self) -> None:
        return None

    async def export(self, checkpoint_id: str, target: Path) -> None:
        raise self._unsupported()
