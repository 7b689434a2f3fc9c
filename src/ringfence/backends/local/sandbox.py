"""A local interactive sandbox with its state: checkpoints of its volume's layers (the
workspace, ``/tmp`` and the upper layers of its root), rollback in place, freeze and thaw
of its cgroup, and exports a new sandbox is restored from (``LaunchSpec.restore``).

``checkpoint`` freezes the sandbox's cgroup, takes an incremental snapshot
(``snapshots.SnapshotStore``) and thaws it; ``rollback`` restores in place while frozen, so
its processes survive and see the checkpoint's files when they run again (the root's upper
layers are changed through the sandbox's own view of its overlays where the overlay would
not see a change made behind it). Process memory is not captured (``memory: false``).
Operations on one sandbox run one at a time, each off the event loop (a freeze may wait
for the kernel, a large tree takes a while).

A rollback that fails after its first write never lets the sandbox run again: its files
would be partly the checkpoint's and partly the present's. It is killed while still frozen,
and it ends failed with why ("rollback failed part way: ...").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path, PurePosixPath
from typing import TypeVar

from ringfence.backends._interactive import Checkpoint, StateSupport, Usage
from ringfence.backends.daemon_sandbox import DaemonSandbox
from ringfence.backends.local.backend import SandboxParts
from ringfence.backends.local.snapshots import (
    Budget,
    OverlayView,
    RestoreIncomplete,
    SnapshotStore,
)
from ringfence.backends.local.volume import Volume
from ringfence.backends.proc_usage import cpu_seconds_of
from ringfence.errors import (
    CheckpointNotFound,
    RingfenceError,
    SandboxError,
    SandboxNotRunning,
    SnapshotBudgetExceeded,
    StateUnsupported,
)
from ringfence.models import ExecutionResult, Status

__all__ = ["LocalSandbox", "layers_of"]

T = TypeVar("T")
# An idle sandbox's usage is carried this long at most (reclaim may shrink its memory
# without any of its tasks running).
_CARRY_SECONDS = 30.0


def layers_of(volume: Volume) -> dict[str, Path]:
    """The layers of ``volume`` by the names snapshots and exports know them by (the same
    for every sandbox of one image, so an export restores into any of them)."""
    layers = {"workspace": volume.workspace, "tmp": volume.tmp}
    layers.update({f"root-{layer.name}": layer.upper for layer in volume.layers})
    return layers


def _checkpointed(volume: Volume) -> dict[str, Path]:
    """What a checkpoint captures: ``layers_of`` and the project view's upper layer (a
    rollback restores the project's changes too; exports never hold it)."""
    layers = layers_of(volume)
    if volume.project is not None:
        layers["project"] = volume.project.upper
    return layers


class LocalSandbox:
    """A running local sandbox (``LiveSandbox``): the daemon's execution (``inner``) and,
    when it has a volume (``parts``), the state of its files."""

    def __init__(
        self,
        inner: DaemonSandbox,
        parts: SandboxParts | None,
        budget: Budget,
        key: bytes,
        missing: tuple[str, ...],
    ) -> None:
        """``missing``: why this sandbox has no volume (with ``parts`` None)."""
        self._inner = inner
        self._parts = parts
        self._budget_bytes = budget.bytes  # its volume's room for checkpoints
        self._last_usage: tuple[float, Usage] | None = None  # (monotonic, read) for ``usage``
        self._missing = missing
        self._store: SnapshotStore | None = None
        if parts is not None and parts.volume is not None:
            volume = parts.volume
            self._store = SnapshotStore(
                volume.snapshots,
                _checkpointed(volume),
                volume.owners,
                budget,
                key,
                pids=parts.cgroup.pids,  # frozen: whose shared writable mappings to count
            )
        self._lock = asyncio.Lock()
        self._paused = False  # frozen by ``freeze`` (not by a checkpoint in progress)
        self._failure: str | None = None  # why it was killed, when it had to be
        self._closer = asyncio.ensure_future(self._close_store_at_end())

    async def released(self) -> None:
        """Wait until it has ended and let go of everything it held on the host."""
        await asyncio.shield(self._closer)

    async def _close_store_at_end(self) -> None:
        """Once the sandbox has ended (its volume unmounted), let go of the store: its
        open directory would keep the detached tmpfs, and every byte on it, alive."""
        with contextlib.suppress(Exception):  # however it ended
            await self._inner.ended()
        async with self._lock:  # never under an operation's feet (its fds)
            if self._store is not None:
                self._store.close()

    @property
    def socket_path(self) -> Path:
        return self._inner.socket_path

    @property
    def running(self) -> bool:
        return self._inner.running

    async def set_timeout(self, seconds: float) -> None:
        await self._inner.set_timeout(seconds)

    async def kill(self) -> ExecutionResult:
        return self._as_ended(await self._inner.kill())  # it reaches frozen processes too

    async def ended(self) -> ExecutionResult:
        return self._as_ended(await self._inner.ended())

    def _as_ended(self, result: ExecutionResult) -> ExecutionResult:
        """The end, failed with why when this sandbox killed itself (a broken rollback)."""
        if self._failure is None:
            return result
        return result.model_copy(update={"status": Status.FAILED, "error": self._failure})

    @property
    def state(self) -> StateSupport:
        missing = list(self._missing)
        freeze = self._parts is not None and self._parts.cgroup.can_freeze
        if self._parts is not None and not freeze:
            missing.append("this host's cgroups have no freezer")
        missing.append("process memory is not captured (no CRIU): processes restart on restore")
        return StateSupport(
            checkpoints=self._store is not None,
            freeze=freeze,
            memory=False,
            missing=tuple(missing),
        )

    async def checkpoint(self) -> Checkpoint:
        store, parts = self._stateful()
        async with self._changing_files():
            self._check_running()
            return await asyncio.to_thread(self._in_frozen, parts, store.take)

    def checkpoints(self) -> list[Checkpoint]:
        """Its checkpoints, oldest first; none once it has ended (they went with its
        volume)."""
        if self._store is None or not self.running:
            return []
        return self._store.list()

    async def rollback(self, checkpoint_id: str) -> None:
        """Restore its files to ``checkpoint_id`` in place.

        Raises:
            CheckpointNotFound, SnapshotBudgetExceeded, SandboxError: refused before any
                write; it runs on (or stays paused) as it was.
            SandboxError: the restore failed part way; the sandbox was killed while still
                frozen (it ends failed, "rollback failed part way: ..."), never thawed
                into files that never existed together.
        """
        store, parts = self._stateful()
        async with self._changing_files():
            self._check_running()
            root = Path(f"/proc/{parts.init}/root")
            volume = _volume(parts)
            views = {
                f"root-{layer.name}": OverlayView(root, PurePosixPath(layer.target))
                for layer in volume.layers
            }
            if volume.project is not None:  # an overlay too: changed through its view
                views["project"] = OverlayView(root, PurePosixPath(volume.project.target))
            try:
                await asyncio.to_thread(
                    self._in_frozen,
                    parts,
                    lambda: store.restore(checkpoint_id, overlay_view=views),
                    thaw_after=_changed_nothing,
                )
            except BaseException as exc:
                if _changed_nothing(exc):
                    raise
                why = exc.message if isinstance(exc, RingfenceError) else repr(exc)
                self._failure = f"rollback failed part way: {why}"
                await self._inner.kill()  # frozen still: it never runs on mixed files
                raise SandboxError(
                    f"the rollback to {checkpoint_id} failed part way, so the sandbox was "
                    f"killed (its files were partly restored): {why}"
                ) from exc

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        store, _ = self._stateful()
        async with self._changing_files():
            self._check_running()
            await asyncio.to_thread(store.delete, checkpoint_id)

    @contextlib.asynccontextmanager
    async def _changing_files(self) -> AsyncIterator[None]:
        """Hold the lock for an operation that changes its files or checkpoints without
        any of its tasks running (``usage`` carries no earlier read over it)."""
        async with self._lock:
            try:
                yield
            finally:
                self._last_usage = None

    async def freeze(self) -> None:
        parts = self._cgroup_parts()
        async with self._lock:
            self._check_running()
            await asyncio.to_thread(parts.cgroup.freeze)
            self._paused = True

    async def thaw(self) -> None:
        if self._parts is None or not self._paused:
            return
        async with self._lock:
            await asyncio.to_thread(self._parts.cgroup.thaw)
            self._paused = False

    @property
    def project_layer(self) -> Path | None:
        volume = self._parts.volume if self._parts is not None else None
        if volume is None or volume.project is None or not self.running:
            return None
        return volume.project.upper

    async def export(self, checkpoint_id: str, target: Path) -> None:
        """Raises ``StateUnsupported`` for a sandbox with a project view too: its project
        layer belongs to a host directory of this server, and nothing that starts from an
        export (a resume from disk, a snapshot's sandboxes, a fork's children) has it."""
        store, parts = self._stateful()
        if parts.volume is not None and parts.volume.project is not None:
            raise StateUnsupported(
                "a sandbox with a project view cannot be exported (paused to disk, "
                "snapshotted, forked): its view belongs to a host directory; checkpoints, "
                "rollback and a pause keeping memory work"
            )
        async with self._lock:
            self._check_running()
            await asyncio.to_thread(store.export, checkpoint_id, target)

    async def usage(self) -> Usage:
        """Read from its cgroup (CPU time, memory, processes, and the limits as the
        kernel holds them) and its volume's tmpfs (disk: its live files, without what
        only its checkpoints hold; of its disk limit, without the checkpoint budget).
        A frozen sandbox is read as well. On a cgroup v1 host without a cpuacct
        hierarchy, CPU time is that of its live processes only.

        Read on the event loop, not in a thread: a handful of reads of files the kernel
        serves from memory (tens of microseconds), where a thread hop costs more than the
        reads, and a scrape reads every sandbox. Without cpuacct, CPU time is one read
        per process (up to ``MAX_PIDS_READ``), so that reading goes to a thread."""
        parts = self._cgroup_parts()
        self._check_running()
        if parts.cgroup.accounts_cpu:
            return self._usage(parts)
        return await asyncio.to_thread(self._usage, parts)

    def _usage(self, parts: SandboxParts) -> Usage:
        """Read it; or, when its CPU time has not moved since the previous read (none of
        its tasks ran: an idle or frozen sandbox) less than ``_CARRY_SECONDS`` ago, that
        read again for the price of one file. What the server itself changes in its files
        (a rollback) drops the previous read."""
        try:
            cpu_now = parts.cgroup.cpu_seconds()
            last = self._last_usage
            if (
                cpu_now is not None
                and last is not None
                and last[1].cpu_seconds == cpu_now
                and time.monotonic() - last[0] < _CARRY_SECONDS
                and not self._lock.locked()  # no checkpoint or rollback under way
            ):
                return last[1]
            now = parts.cgroup.usage()
        except SandboxError as exc:
            if not self.running or not _cgroup_exists(parts):
                raise SandboxNotRunning("the sandbox has ended") from exc
            raise
        cpu = now.cpu_seconds
        if cpu is None:
            cpu = cpu_seconds_of(parts.cgroup.pids())
        disk_bytes = disk_limit = 0
        if parts.volume is not None:
            try:
                disk = os.statvfs(parts.volume.path)
            except OSError as exc:
                raise SandboxNotRunning("the sandbox has ended") from exc
            held = sum(c.bytes for c in self._store.list()) if self._store is not None else 0
            used = (disk.f_blocks - disk.f_bfree) * disk.f_frsize
            disk_bytes = max(0, used - held)
            disk_limit = max(0, disk.f_blocks * disk.f_frsize - self._budget_bytes)
        usage = Usage(
            cpu_seconds=cpu,
            cpus=now.cpus,
            memory_bytes=now.memory_bytes,
            memory_limit=now.memory_limit,
            disk_bytes=disk_bytes,
            disk_limit=disk_limit,
            pids=now.pids,
            memory_cache_bytes=now.memory_cache_bytes,
        )
        self._last_usage = (time.monotonic(), usage)
        return usage

    def _in_frozen(
        self,
        parts: SandboxParts,
        work: Callable[[], T],
        thaw_after: Callable[[BaseException], bool] = lambda _: True,
    ) -> T:
        """``work()`` with the sandbox frozen (in a worker thread: a large tree takes a
        while); a sandbox paused by ``freeze`` stays frozen after it. When ``work`` raises,
        the sandbox is thawed only if ``thaw_after(error)`` (else it stays frozen, for the
        caller to kill), and a thaw that fails then (a kill removed the cgroup meanwhile)
        never hides ``work``'s own error."""
        if self._paused:
            return work()
        parts.cgroup.freeze()
        try:
            done = work()
        except BaseException as exc:
            if thaw_after(exc):
                with contextlib.suppress(SandboxError, OSError):
                    parts.cgroup.thaw()
            raise
        try:
            parts.cgroup.thaw()
        except (SandboxError, OSError) as exc:
            if self._inner.running and _cgroup_exists(parts):
                raise
            raise SandboxNotRunning("the sandbox was killed during the operation") from exc
        return done

    def _stateful(self) -> tuple[SnapshotStore, SandboxParts]:
        if self._store is None or self._parts is None:
            raise StateUnsupported(
                f"sandbox state cannot be captured: {'; '.join(self._missing) or 'no volume'}"
            )
        self._check_running()  # its checkpoints went with its volume
        return self._store, self._parts

    def _cgroup_parts(self) -> SandboxParts:
        if self._parts is None:
            raise StateUnsupported(
                f"this sandbox cannot be frozen: {'; '.join(self._missing) or 'no cgroup'}"
            )
        return self._parts

    def _check_running(self) -> None:
        if not self.running:
            raise SandboxNotRunning("the sandbox has ended")


def _changed_nothing(error: BaseException) -> bool:
    """Whether a failed restore is known to have written nothing (a refusal: the missing
    checkpoint, the budget, a view that is not its overlay...). ``RestoreIncomplete`` is
    raised once it has written; anything else unexpected counts as part way too (fail
    closed)."""
    if isinstance(error, RestoreIncomplete):
        return False
    return isinstance(error, SandboxError | CheckpointNotFound | SnapshotBudgetExceeded)


def _cgroup_exists(parts: SandboxParts) -> bool:
    return all(directory.exists() for directory in parts.cgroup._dirs())


def _volume(parts: SandboxParts) -> Volume:
    assert parts.volume is not None
    return parts.volume
