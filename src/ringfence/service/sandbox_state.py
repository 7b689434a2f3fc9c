"""A sandbox's files as state: checkpoints and rollback, snapshots, fork.

- **Checkpoints** belong to a running sandbox and live on the host with it (the runtime
  holds them, budgeted); ``rollback`` restores one in place (processes keep running). Each
  call resolves the sandbox in the caller's tenant first (resuming a paused one, as any
  request does), so a checkpoint id of another sandbox is "not found" there.
- **Snapshots** are checkpoints exported to the data directory and recorded in the store,
  owned by the tenant: listed, deleted, and the start of new sandboxes
  (``SandboxSpec.snapshot``). Another tenant's is "not found".
- **Fork(n)**: one checkpoint of the parent, exported once, and ``n`` children started from
  it: each a new sandbox (its own id, tokens, cgroup, network session) with the parent's
  template, limits, metadata, environment and egress policy, and the parent's time left.
  Every child's share of the budgets is reserved before any starts (refused as a whole when
  there is no room); a child that fails to start takes the others with it (all or none).
  The children's processes start fresh on the files (no memory is copied), so every
  userspace PRNG is seeded anew in each.

Every operation goes on the audit record (``sandbox.checkpoint``, ``.rollback``,
``.checkpoint_delete``, ``.snapshot``, ``.fork``; ``snapshot.delete``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from ringfence.audit.chain import SYSTEM
from ringfence.backends import Checkpoint, LaunchSpec, LiveSandbox
from ringfence.errors import (
    CheckpointNotFound,
    InvalidRequest,
    RingfenceError,
    SandboxError,
    SnapshotBudgetExceeded,
    TooManyRequests,
)
from ringfence.models import (
    MAX_FORK_CHILDREN,
    CheckpointInfo,
    Forked,
    ResourceLimits,
    Sandbox,
    SandboxSpec,
    Snapshot,
)
from ringfence.service.budget import Reservation
from ringfence.service.state_files import StateFiles
from ringfence.store import Store

__all__ = ["MAX_SNAPSHOTS_PER_TENANT", "SandboxStates"]

MAX_SNAPSHOTS_PER_TENANT = 100  # each is a whole tree on the server's disk


class Sandboxes(Protocol):
    """What the state operations need of the sandbox service (``SandboxService``)."""

    async def get(self, tenant: str, sandbox_id: str) -> Sandbox: ...

    async def live(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> LiveSandbox: ...

    def launch_of(self, tenant: str, sandbox_id: str) -> LaunchSpec:
        """How it was started: its environment (without the variable of its own id) and
        egress policy, values included."""
        ...

    async def reserve(self, tenant: str, limits: ResourceLimits) -> list[Reservation]: ...

    def release(self, held: list[Reservation]) -> None: ...

    async def create_from(
        self,
        tenant: str,
        spec: SandboxSpec,
        *,
        actor: str = SYSTEM,
        restore: Path | None = None,
        held: list[Reservation] | None = None,
    ) -> Sandbox: ...

    async def kill(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> Sandbox: ...

    def record(
        self,
        tenant: str,
        actor: str,
        action: str,
        sandbox_id: str,
        outcome: str = "ok",
        details: Mapping[str, object] | None = None,
    ) -> None: ...


class SandboxStates:
    """Checkpoints, snapshots and fork of a tenant's sandboxes (see the module docstring).

    Every method taking a ``sandbox_id`` raises what finding it running raises:
    ``SandboxNotFound`` (also another tenant's), ``SandboxNotRunning``, ``SandboxElsewhere``,
    and ``StateUnsupported`` when its backend captures no state (the message says why).
    """

    def __init__(self, sandboxes: Sandboxes, store: Store, files: StateFiles) -> None:
        self._sandboxes = sandboxes
        self._store = store
        self._files = files

    async def checkpoint(
        self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM
    ) -> CheckpointInfo:
        """Capture the sandbox's files (its processes keep running).

        Raises:
            SnapshotBudgetExceeded: its checkpoints are at their count or bytes.
        """
        live = await self._sandboxes.live(tenant, sandbox_id, actor=actor)
        try:
            checkpoint = await live.checkpoint()
        except RingfenceError as exc:
            self._record(tenant, actor, "sandbox.checkpoint", sandbox_id, exc)
            raise
        self._record(tenant, actor, "sandbox.checkpoint", sandbox_id,
                     details={"checkpoint": checkpoint.id, "files": checkpoint.files,
                              "bytes": checkpoint.bytes})  # fmt: skip
        return _info(checkpoint)

    async def checkpoints(self, tenant: str, sandbox_id: str) -> list[CheckpointInfo]:
        """The sandbox's checkpoints, oldest first."""
        live = await self._sandboxes.live(tenant, sandbox_id)
        return [_info(checkpoint) for checkpoint in live.checkpoints()]

    async def rollback(
        self, tenant: str, sandbox_id: str, checkpoint_id: str, *, actor: str = SYSTEM
    ) -> None:
        """Restore the sandbox's files to ``checkpoint_id`` in place (processes survive).

        Raises:
            CheckpointNotFound: the sandbox has no such checkpoint (another's: the same).
        """
        live = await self._sandboxes.live(tenant, sandbox_id, actor=actor)
        details = {"checkpoint": checkpoint_id}
        try:
            await live.rollback(checkpoint_id)
        except RingfenceError as exc:
            self._record(tenant, actor, "sandbox.rollback", sandbox_id, exc, details)
            raise
        self._record(tenant, actor, "sandbox.rollback", sandbox_id, details=details)

    async def delete_checkpoint(
        self, tenant: str, sandbox_id: str, checkpoint_id: str, *, actor: str = SYSTEM
    ) -> None:
        """Free a checkpoint. Raises ``CheckpointNotFound``."""
        live = await self._sandboxes.live(tenant, sandbox_id, actor=actor)
        await live.delete_checkpoint(checkpoint_id)
        self._record(tenant, actor, "sandbox.checkpoint_delete", sandbox_id,
                     details={"checkpoint": checkpoint_id})  # fmt: skip

    async def snapshot(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> Snapshot:
        """Persist the sandbox's files as a snapshot of the tenant's.

        Raises:
            SnapshotBudgetExceeded: the tenant keeps as many snapshots as it may (or the
                sandbox's checkpoints are at their budget).
        """
        if len(await self._store.list_snapshots(tenant, limit=MAX_SNAPSHOTS_PER_TENANT)) >= (
            MAX_SNAPSHOTS_PER_TENANT
        ):
            raise SnapshotBudgetExceeded(
                f"tenant {tenant!r} keeps {MAX_SNAPSHOTS_PER_TENANT} snapshots, the most it "
                "may: delete one first"
            )
        live = await self._sandboxes.live(tenant, sandbox_id, actor=actor)
        sandbox = await self._sandboxes.get(tenant, sandbox_id)
        snapshot_id = "sn" + secrets.token_hex(10)
        target = self._files.snapshot(snapshot_id)
        try:
            checkpoint = await _exported(live, target)
            snapshot = Snapshot(
                id=snapshot_id,
                sandbox_id=sandbox_id,
                template=sandbox.template,
                created_at=datetime.now(UTC),
                files=checkpoint.files,
                bytes=await asyncio.to_thread(_size, target),
                metadata=sandbox.metadata,
            )
            await self._store.add_snapshot(tenant, snapshot)
        except BaseException as exc:
            self._files.remove(target)
            if isinstance(exc, RingfenceError):
                self._record(tenant, actor, "sandbox.snapshot", sandbox_id, exc)
            raise
        self._record(tenant, actor, "sandbox.snapshot", sandbox_id,
                     details={"snapshot": snapshot_id, "files": snapshot.files,
                              "bytes": snapshot.bytes})  # fmt: skip
        return snapshot

    async def snapshots(self, tenant: str, *, limit: int = 100) -> list[Snapshot]:
        """The tenant's snapshots, newest first."""
        return await self._store.list_snapshots(tenant, limit=limit)

    async def get_snapshot(self, tenant: str, snapshot_id: str) -> Snapshot:
        """Raises ``CheckpointNotFound`` (also for another tenant's)."""
        snapshot = await self._store.get_snapshot(tenant, snapshot_id)
        if snapshot is None:
            raise CheckpointNotFound(f"no snapshot with id {snapshot_id!r}")
        return snapshot

    async def delete_snapshot(self, tenant: str, snapshot_id: str, *, actor: str = SYSTEM) -> None:
        """Forget a snapshot and remove its files (sandboxes started from it keep theirs).

        Raises:
            CheckpointNotFound: no such snapshot in this tenant.
        """
        if not await self._store.delete_snapshot(tenant, snapshot_id):
            raise CheckpointNotFound(f"no snapshot with id {snapshot_id!r}")
        await asyncio.to_thread(self._files.remove, self._files.snapshot(snapshot_id))
        self._sandboxes.record(tenant, actor, "snapshot.delete", snapshot_id)

    async def fork(
        self, tenant: str, sandbox_id: str, count: int, *, actor: str = SYSTEM
    ) -> Forked:
        """Start ``count`` children from one checkpoint of the sandbox (see the module
        docstring).

        Raises:
            InvalidRequest: ``count`` is not within 1 and ``MAX_FORK_CHILDREN``.
            TooManyRequests: no room for all of them in the tenant's budget or the
                server's (none was made; the message says which).
            SandboxError: a child could not start (none was kept: the message says why).
        """
        if not 1 <= count <= MAX_FORK_CHILDREN:
            raise InvalidRequest(f"count: a fork makes 1 to {MAX_FORK_CHILDREN} children")
        live = await self._sandboxes.live(tenant, sandbox_id, actor=actor)
        parent = await self._sandboxes.get(tenant, sandbox_id)
        spec = _child_spec(parent, self._sandboxes.launch_of(tenant, sandbox_id))
        holds = await self._reserve_all(tenant, parent.limits, count)
        target = self._files.new_fork()
        try:
            await _exported(live, target)
            made = await asyncio.gather(
                *(self._sandboxes.create_from(tenant, spec, actor=actor, restore=target,
                                              held=held) for held in holds),
                return_exceptions=True,
            )  # fmt: skip
        finally:
            for held in holds:
                self._sandboxes.release(held)
        children = [child for child in made if isinstance(child, Sandbox)]
        failures = [error for error in made if not isinstance(error, Sandbox)]
        if failures:
            for child in children:
                with contextlib.suppress(RingfenceError):
                    await self._sandboxes.kill(tenant, child.id, actor=actor)
            self._files.remove(target)
            self._record(tenant, actor, "sandbox.fork", sandbox_id, failures[0],
                         {"count": count})  # fmt: skip
            first = failures[0]
            why = first.message if isinstance(first, RingfenceError) else repr(first)
            raise SandboxError(
                f"fork: {len(failures)} of {count} children could not start ({why}); the "
                f"{len(children)} that did were killed: nothing was made"
            ) from first
        self._record(tenant, actor, "sandbox.fork", sandbox_id,
                     details={"count": count, "children": [c.id for c in children]})  # fmt: skip
        return Forked(parent=sandbox_id, children=children)

    async def _reserve_all(
        self, tenant: str, limits: ResourceLimits, count: int
    ) -> list[list[Reservation]]:
        """Every child's shares, or none. A server without room answers as the tenant's
        budget does (429, not 503): the fork as asked does not fit now, a smaller one may."""
        holds: list[list[Reservation]] = []
        try:
            for _ in range(count):
                holds.append(await self._sandboxes.reserve(tenant, limits))
        except TooManyRequests as exc:  # the server's room too: the fork asked too much now
            for held in holds:
                self._sandboxes.release(held)
            raise TooManyRequests(
                f"fork of {count} refused as a whole (no child was made): {exc.message}"
            ) from exc
        except BaseException:
            for held in holds:
                self._sandboxes.release(held)
            raise
        return holds

    def _record(
        self,
        tenant: str,
        actor: str,
        action: str,
        sandbox_id: str,
        error: BaseException | None = None,
        details: Mapping[str, object] | None = None,
    ) -> None:
        details = dict(details or {})
        if error is not None:
            details["error"] = error.message if isinstance(error, RingfenceError) else repr(error)
        outcome = "ok" if error is None else "failed"
        self._sandboxes.record(tenant, actor, action, sandbox_id, outcome, details)


async def _exported(live: LiveSandbox, target: Path) -> Checkpoint:
    """Checkpoint ``live`` and export it to ``target``; the checkpoint itself is freed (the
    export is what is kept)."""
    checkpoint = await live.checkpoint()
    try:
        await live.export(checkpoint.id, target)
    finally:
        with contextlib.suppress(RingfenceError):
            await live.delete_checkpoint(checkpoint.id)
    return checkpoint


def _child_spec(parent: Sandbox, launch: LaunchSpec) -> SandboxSpec:
    """A fork's child: the parent's template, limits, metadata, lifecycle, environment
    and egress policy (values included; ``launch``, from ``Sandboxes.launch_of``), and its
    volumes (the same ones, shared: a volume is no part of a sandbox's state)."""
    left = None
    if parent.expires_at is not None:
        left = max(1.0, (parent.expires_at - datetime.now(UTC)).total_seconds())
    return SandboxSpec(
        template=parent.template,
        timeout=left,
        env=launch.env,
        metadata=parent.metadata,
        limits=parent.limits,
        network=launch.network,
        auto_pause=parent.auto_pause,
        on_timeout=parent.on_timeout,
        auto_resume=parent.auto_resume,
        volumes=parent.volumes,
    )


def _info(checkpoint: Checkpoint) -> CheckpointInfo:
    return CheckpointInfo(
        id=checkpoint.id,
        created_at=checkpoint.created_at,
        files=checkpoint.files,
        bytes=checkpoint.bytes,
        memory=checkpoint.memory,
    )


def _size(root: Path) -> int:
    """Bytes of the regular files under ``root`` (links not followed)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                status = os.lstat(os.path.join(directory, name))
                total += status.st_size if stat.S_ISREG(status.st_mode) else 0
    return total
