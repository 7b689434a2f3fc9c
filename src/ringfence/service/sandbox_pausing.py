"""Pause and resume of interactive sandboxes (a part of ``SandboxService``), and the live
table's entries both share.

A pause keeps memory (``memory=True``: the sandbox is frozen where it is; its memory stays
held, so it stays counted against its tenant's and the server's memory, not as running) or
frees it (``memory=False``: its files are exported to the data directory, what its resume
needs is kept sealed beside them, and it is killed: uid, cgroup and volume freed, nothing
held). Either way its timeout clock stops. A resume thaws a frozen one, or starts one saved
to disk again on its export, under the same id; any request to a paused sandbox resumes it
(``SandboxService.daemon``), once however many wait, unless it was made with auto_resume
off. ``auto_pause`` (idle seconds) and ``on_timeout="pause"`` pause to disk; a sandbox
paused by its timeout has a fresh default timeout for its resume (as E2B's auto-resume: else
it would pause again a second after each resume). One lock per sandbox id orders pauses,
resumes and kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ringfence.audit.chain import SYSTEM
from ringfence.backends import LaunchSpec, LiveSandbox, SandboxRuntime, StateSupport
from ringfence.config import Config
from ringfence.errors import (
    RingfenceError,
    SandboxElsewhere,
    SandboxError,
    SandboxNotRunning,
    StateUnsupported,
    TooManyRequests,
)
from ringfence.models import Paused, Sandbox, SandboxState
from ringfence.network.session import Asker, Requester, requesting
from ringfence.service.audit import AuditLog
from ringfence.service.budget import Amount, Budget, Reservation
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.state_files import StateFiles
from ringfence.service.volumes import VolumeService
from ringfence.store import Store

__all__ = [
    "DAEMON_START_SECONDS",
    "LiveEntry",
    "Pausing",
    "check_lifecycle",
    "deadline_of",
    "ended_here",
    "live_timeout",
]

log = logging.getLogger(__name__)

DAEMON_START_SECONDS = 10.0
# A frozen sandbox's deadline: its timeout clock stops while paused, but nothing is held
# forever (it is killed after this long frozen).
_FROZEN_SECONDS = 30 * 24 * 3600.0
# With on_timeout="pause" the service pauses the sandbox at its timeout; the runtime's own
# deadline is this much later, so a pause that fails still ends it (fail closed).
_PAUSE_GRACE_SECONDS = 60.0
_LIFECYCLE_POLL_SECONDS = 1.0  # how often a frozen or pausing sandbox's lifecycle looks again


@dataclass
class LiveEntry:
    """One sandbox this process runs (an entry of the live table, by sandbox id)."""

    tenant: str
    live: LiveSandbox  # the runtime's handle; the record (``Sandbox``) is in the store
    daemon: DaemonClient
    ended: asyncio.Future[Sandbox]
    launch: LaunchSpec  # how it was started (values included: never stored in clear)
    deadline: float  # when its timeout passes (the event loop's clock)
    failure: str | None = None  # why it is being killed, when that is a failure
    ending: bool = False  # the watcher is storing its end
    killing: bool = False  # a kill was asked for: its end is stored as killed
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one store write at a time
    # A pooled sandbox's record, still being written after its claim was answered.
    recorded: asyncio.Task[None] | None = None
    # What it holds of its tenant's budget and the server's: given back when its end is stored.
    reservations: list[Reservation] = field(default_factory=list)
    frozen: list[Reservation] | None = None  # paused keeping memory: what it held running
    pausing: Sandbox | None = None  # paused to disk: the record its watcher stores at its end
    touched: float = 0.0  # its last request (the event loop's clock), for auto_pause
    # Set when ``deadline`` moves (set_timeout): its lifecycle looks again at once.
    moved: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def awake(self) -> bool:
        """Running and serving: not ended, not frozen, not being paused."""
        return not self.ended.done() and self.frozen is None and self.pausing is None

    async def record_written(self) -> None:
        """Wait until the sandbox's record is written (or failed to be: the store says)."""
        if self.recorded is not None:
            await asyncio.wait({self.recorded})


class Pausing:
    """``SandboxService``'s pause and resume (a part of it, split off to keep modules
    small: it is no service of its own)."""

    _store: Store
    _runtime: SandboxRuntime | None
    _config: Config
    _budget: Budget
    _audit: AuditLog | None
    _egress_asker: Asker | None
    _live: dict[str, LiveEntry]
    _watchers: set[asyncio.Task[None]]
    files: StateFiles
    volumes: VolumeService

    if TYPE_CHECKING:

        def _lock(self, sandbox_id: str) -> asyncio.Lock: ...

        async def get(self, tenant: str, sandbox_id: str) -> Sandbox: ...

        async def _running(self, tenant: str, sandbox_id: str) -> LiveEntry: ...

        async def _reserve_host(self, amount: Amount) -> Reservation: ...

        def _adopt(
            self,
            tenant: str,
            sandbox: Sandbox,
            live: LiveSandbox,
            launch: LaunchSpec,
            held: list[Reservation],
        ) -> LiveEntry: ...

        def record(
            self,
            tenant: str,
            actor: str,
            action: str,
            sandbox_id: str,
            outcome: str = "ok",
            details: Mapping[str, object] | None = None,
        ) -> None: ...

    async def pause(
        self,
        tenant: str,
        sandbox_id: str,
        *,
        memory: bool = False,
        actor: str = SYSTEM,
        reason: str = "asked",
    ) -> Paused:
        """Pause a running sandbox. ``memory`` True: freeze it (its processes stopped where
        they are, their memory held: they go on where they were on resume). False: save its
        files to the data directory and kill it, freeing its memory, host uid, cgroup and
        volume (its processes start again on resume, under the same id). Either way its
        timeout clock stops, and it no longer counts as running (a frozen one's memory
        stays counted: it is still held). Pausing a paused sandbox again with memory False
        saves a frozen one to disk; otherwise it answers as it is.

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
            SandboxNotRunning: it has ended.
            StateUnsupported: its backend has no freezer (memory True) or cannot save its
                files (memory False); the message says which and why.
            SandboxError: saving its files failed (it keeps running).
        """
        async with self._lock(sandbox_id):
            sandbox = await self.get(tenant, sandbox_id)
            if sandbox.state is SandboxState.PAUSED and (memory or not sandbox.memory):
                return Paused(sandbox=sandbox, memory=bool(sandbox.memory))
            entry = await self._running(tenant, sandbox_id)
            # A claim from the warm pool is answered with its /init in flight. Frozen
            # before its daemon has read it, the sandbox could not answer it: paused to
            # disk, the kill resets that /init and the claim then ends the sandbox failed
            # (the pause answers "ended while it was being paused"); frozen in memory, the
            # /init times out and the claim kills the frozen sandbox. So the environment
            # is set first (SandboxNotRunning when it failed: the sandbox is being killed).
            await entry.daemon.initialized()
            left = _time_left(sandbox)
            if reason == "timeout":  # nothing was left: its resume gets a new lifetime
                fresh = min(self._config.default_sandbox_timeout, self._config.max_timeout)
                left = max(left, fresh)
            try:
                _check_pausable(entry.live.state, sandbox_id, memory)
                if memory:
                    paused = await self._freeze(entry, sandbox, left)
                else:
                    paused = await self._save(entry, sandbox, left)
            except RingfenceError as exc:
                self.record(tenant, actor, "sandbox.pause", sandbox_id, "failed",
                            {"memory": memory, "reason": reason, "error": exc.message})  # fmt: skip
                raise
        self.record(
            tenant, actor, "sandbox.pause", sandbox_id,
            details={"memory": memory, "reason": reason, "timeout_left": round(left, 3)},
        )  # fmt: skip
        return Paused(sandbox=paused, memory=memory)

    async def _freeze(self, entry: LiveEntry, sandbox: Sandbox, left: float) -> Sandbox:
        async with entry.writing:
            if entry.ending:
                raise SandboxNotRunning(f"sandbox {sandbox.id} is ending")
            await entry.live.freeze()
            try:
                await entry.live.set_timeout(_FROZEN_SECONDS)
                paused = _paused(sandbox, memory=True, left=left)
                await self._store.update_sandbox(entry.tenant, paused)
            except BaseException:
                await entry.live.set_timeout(live_timeout(sandbox, left))
                await entry.live.thaw()
                raise
            entry.frozen = self._hold_memory_only(entry)
        return paused

    async def _save(self, entry: LiveEntry, sandbox: Sandbox, left: float) -> Sandbox:
        """Export its files (a checkpoint), keep its launch sealed, and kill it: its
        watcher stores it paused, and gives back all it held. It is frozen from before the
        checkpoint until the kill (a checkpoint of a frozen sandbox leaves it frozen), so
        no write after the checkpoint is lost; a failed save thaws it again (it runs on).
        A backend without a freezer is checkpointed running: what it writes between the
        checkpoint and the kill is lost (``LiveSandbox.state.freeze`` says which)."""
        self.files.forget_paused(sandbox.id)  # a leftover of an earlier, failed pause
        export = self.files.paused_export(sandbox.id)
        was_frozen = entry.frozen is not None
        try:
            if entry.live.state.freeze:
                await entry.live.freeze()
            checkpoint = await entry.live.checkpoint()
            try:
                await entry.live.export(checkpoint.id, export)
            finally:
                with contextlib.suppress(RingfenceError):
                    await entry.live.delete_checkpoint(checkpoint.id)
            launch = dataclasses.replace(entry.launch, restore=None)
            await asyncio.to_thread(self.files.save_launch, entry.tenant, sandbox.id, launch)
        except BaseException:
            self.files.forget_paused(sandbox.id)
            if not was_frozen:
                with contextlib.suppress(RingfenceError):
                    await entry.live.thaw()
            raise
        paused = _paused(sandbox, memory=False, left=left)
        async with entry.writing:
            if entry.ending:
                self.files.forget_paused(sandbox.id)
                raise SandboxNotRunning(f"sandbox {sandbox.id} ended while it was being paused")
            entry.pausing = paused
        await entry.live.kill()  # still frozen: a thaw first would let it write on, lost
        stored = await asyncio.shield(entry.ended)
        if stored.state is not SandboxState.PAUSED:  # it failed meanwhile: nothing to resume
            self.files.forget_paused(sandbox.id)
            raise SandboxNotRunning(f"sandbox {sandbox.id} ended while it was being paused")
        return stored

    async def resume(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> Sandbox:
        """Resume a paused sandbox, under the same id (a running one is returned as it
        is): a frozen one goes on where it was; one paused to disk starts again on its
        saved files (its processes restart; its environment, egress policy, metadata and
        access tokens are the same). Its timeout clock goes on from where it stopped.

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
            SandboxNotRunning: it has ended.
            SandboxElsewhere: it is frozen on another replica.
            TooManyRequests, ServerAtCapacity: no room for it to run now (it stays paused).
            SandboxError: it could not be started again (it stays paused: retry).
        """
        async with self._lock(sandbox_id):
            sandbox = await self.get(tenant, sandbox_id)
            if sandbox.state is SandboxState.PAUSED:
                return await self._resume(tenant, sandbox, actor, implicit=False)
            await self._running(tenant, sandbox_id)  # ended: SandboxNotRunning
            return sandbox

    async def _resume(
        self, tenant: str, sandbox: Sandbox, actor: str, *, implicit: bool
    ) -> Sandbox:
        """Resume ``sandbox`` (paused; its lock held)."""
        entry = self._live.get(sandbox.id)
        left = sandbox.timeout_left or 1.0
        details: dict[str, object] = {"memory": bool(sandbox.memory), "implicit": implicit}
        try:
            if sandbox.memory:
                if entry is None or entry.tenant != tenant or entry.frozen is None:
                    ended_here(sandbox)  # frozen elsewhere: SandboxElsewhere
                    raise SandboxNotRunning(f"sandbox {sandbox.id} was lost while frozen")
                resumed = await self._thaw(entry, sandbox, left)
            else:
                resumed = await self._restart(tenant, sandbox, left, actor)
        except RingfenceError as exc:
            failed = {**details, "error": exc.message}
            self.record(tenant, actor, "sandbox.resume", sandbox.id, "failed", failed)
            raise
        self.record(tenant, actor, "sandbox.resume", sandbox.id, details=details)
        return resumed

    async def _thaw(self, entry: LiveEntry, sandbox: Sandbox, left: float) -> Sandbox:
        assert entry.frozen is not None
        self._hold_running(entry)  # TooManyRequests: no room, it stays frozen
        try:
            resumed = _resumed(sandbox, left)
            async with entry.writing:
                if entry.ending:
                    raise SandboxNotRunning(f"sandbox {sandbox.id} is ending")
                await self._store.update_sandbox(entry.tenant, resumed)
                await entry.live.set_timeout(live_timeout(sandbox, left))
                await entry.live.thaw()
        except BaseException:
            entry.frozen = self._hold_memory_only(entry)
            raise
        entry.deadline = asyncio.get_running_loop().time() + left
        return resumed

    async def _restart(self, tenant: str, sandbox: Sandbox, left: float, actor: str) -> Sandbox:
        """Start a sandbox paused to disk again, on its export, under its id."""
        if self._runtime is None:
            raise SandboxError("this server's backend runs no interactive sandboxes")
        launch = await asyncio.to_thread(self.files.load_launch, tenant, sandbox.id, left)
        amount = self._budget.amount(sandbox.limits)
        held = [self._budget.reserve(tenant, amount, on_host=False)]
        try:
            held.append(await self._reserve_host(amount))
            requester = Requester(
                tenant, f"sandbox:{sandbox.id}", actor, self._audit, self._egress_asker
            )
            # Its volumes again (the record names them: a paused sandbox's are undeletable).
            async with self.volumes.bound(tenant, sandbox.volumes) as volumes:
                launch = dataclasses.replace(launch, volumes=volumes)
                with requesting(requester):
                    live = await self._runtime.start(deadline_of(launch, sandbox))
        except RingfenceError as exc:
            for reservation in held:
                self._budget.release(reservation)
            if isinstance(exc, TooManyRequests):
                raise
            raise SandboxError(f"sandbox {sandbox.id} could not be resumed: {exc.message}") from exc
        except BaseException:
            for reservation in held:
                self._budget.release(reservation)
            raise
        resumed = _resumed(sandbox, left)
        entry = self._adopt(tenant, resumed, live, dataclasses.replace(launch, restore=None), held)
        try:
            await entry.daemon.health(DAEMON_START_SECONDS)
            async with entry.writing:
                await self._store.update_sandbox(tenant, resumed)
        except BaseException as exc:
            entry.pausing = sandbox  # still paused: its files stay for another try
            await asyncio.shield(live.kill())
            if isinstance(exc, SandboxNotRunning):
                raise SandboxError(f"sandbox {sandbox.id} did not start again: {exc}") from exc
            raise
        self.files.forget_paused(sandbox.id)
        self._start_lifecycle(resumed, entry)
        return resumed

    def _hold_memory_only(self, entry: LiveEntry) -> list[Reservation]:
        """Swap what a sandbox being frozen holds for its memory alone, outside the running
        count (its processes run nothing, but their memory is still taken). Returns what
        it held running, for ``_hold_running``."""
        running, entry.reservations = entry.reservations, []
        for was in running:
            self._budget.release(was)
            memory = Amount(was.amount.memory, 0.0)
            held = self._budget.reserve(was.tenant, memory, on_host=was.on_host, counted=False)
            entry.reservations.append(held)
        return running

    def _hold_running(self, entry: LiveEntry) -> None:
        """Hold again what a frozen sandbox held running (``entry.frozen``).

        Raises:
            TooManyRequests, ServerAtCapacity: there is no room now (nothing changes).
        """
        assert entry.frozen is not None
        for reservation in entry.reservations:
            self._budget.release(reservation)
        again: list[Reservation] = []
        try:
            for was in entry.frozen:
                again.append(self._budget.reserve(was.tenant, was.amount, on_host=was.on_host))
        except BaseException:
            for reservation in again:
                self._budget.release(reservation)
            entry.reservations = [
                self._budget.reserve(r.tenant, r.amount, on_host=r.on_host, counted=False)
                for r in entry.reservations
            ]
            raise
        entry.reservations, entry.frozen = again, None

    def _start_lifecycle(self, sandbox: Sandbox, entry: LiveEntry) -> None:
        """Pause it when idle (``auto_pause``) or at its timeout (``on_timeout="pause"``)."""
        if sandbox.auto_pause is None and sandbox.on_timeout != "pause":
            return
        task = asyncio.create_task(self._lifecycle(sandbox, entry))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _lifecycle(self, sandbox: Sandbox, entry: LiveEntry) -> None:
        loop = asyncio.get_running_loop()
        while not entry.ended.done():
            due: list[tuple[float, str]] = []
            if sandbox.auto_pause is not None:
                due.append((entry.touched + sandbox.auto_pause, "idle"))
            if sandbox.on_timeout == "pause":
                due.append((entry.deadline, "timeout"))
            wake, reason = min(due)
            if entry.frozen is not None or entry.pausing is not None:
                wake, reason = loop.time() + _LIFECYCLE_POLL_SECONDS, ""
            moved = asyncio.ensure_future(entry.moved.wait())
            waits: set[asyncio.Future[Any]] = {entry.ended, moved}
            try:
                await asyncio.wait(
                    waits, timeout=max(0.0, wake - loop.time()), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                moved.cancel()
            if entry.moved.is_set():  # a sooner deadline must not wait for the later one
                entry.moved.clear()
                continue
            if entry.ended.done() or not reason or not entry.awake:
                continue
            if reason == "idle" and entry.touched + (sandbox.auto_pause or 0) > loop.time():
                continue  # a request came meanwhile
            if reason == "timeout" and entry.deadline > loop.time():
                continue  # set_timeout moved it
            try:
                await self.pause(entry.tenant, sandbox.id, memory=False, reason=reason)
            except Exception as exc:  # boundary: the runtime's own deadline still ends it
                if entry.ended.done():
                    return  # killed meanwhile (a kill holds the lock the pause waited for)
                log.error("could not pause sandbox %s (%s): %s", sandbox.id, reason, exc)
                if not isinstance(exc, RingfenceError):  # pause records its own refusals
                    self.record(entry.tenant, SYSTEM, "sandbox.pause", sandbox.id, "failed",
                                {"reason": reason, "error": repr(exc)})  # fmt: skip
                if reason == "timeout":
                    await entry.live.kill()
                return
            return


def _paused(sandbox: Sandbox, *, memory: bool, left: float) -> Sandbox:
    update = {"state": SandboxState.PAUSED, "memory": memory, "timeout_left": left,
              "paused_at": datetime.now(UTC), "expires_at": None}  # fmt: skip
    return sandbox.model_copy(update=update)


def _resumed(sandbox: Sandbox, left: float) -> Sandbox:
    expires = datetime.now(UTC) + timedelta(seconds=left)
    update = {"state": SandboxState.RUNNING, "memory": None, "timeout_left": None,
              "paused_at": None, "expires_at": expires}  # fmt: skip
    return sandbox.model_copy(update=update)


def _time_left(sandbox: Sandbox) -> float:
    """Seconds of its timeout left (at least 1: a resume must outlive its own start)."""
    if sandbox.state is SandboxState.PAUSED and sandbox.timeout_left is not None:
        return sandbox.timeout_left
    if sandbox.expires_at is None:
        return 1.0
    return max(1.0, (sandbox.expires_at - datetime.now(UTC)).total_seconds())


def live_timeout(sandbox: Sandbox, timeout: float) -> float:
    """The runtime's deadline for a timeout of ``timeout``: later by a grace when the
    service pauses it at its timeout instead (the runtime's deadline stays, fail closed)."""
    return timeout + (_PAUSE_GRACE_SECONDS if sandbox.on_timeout == "pause" else 0.0)


def deadline_of(launch: LaunchSpec, sandbox: Sandbox) -> LaunchSpec:
    return dataclasses.replace(launch, timeout=live_timeout(sandbox, launch.timeout))


def check_lifecycle(sandbox: Sandbox, live: LiveSandbox) -> None:
    """Raises ``StateUnsupported`` when ``sandbox`` asks to be paused (idle, or at its
    timeout) but ``live``'s backend cannot save its files."""
    support = live.state
    pauses = sandbox.auto_pause is not None or sandbox.on_timeout == "pause"
    if pauses and not support.checkpoints:
        raise StateUnsupported(
            "auto_pause and on_timeout='pause' save the sandbox's files, which this backend "
            f"cannot: {_why(support.missing, 'no writable layer')}"
        )


def _check_pausable(support: StateSupport, sandbox_id: str, memory: bool) -> None:
    """Raises ``StateUnsupported`` naming why the sandbox cannot be paused so."""
    if memory and not support.freeze:
        raise StateUnsupported(
            f"sandbox {sandbox_id} cannot be paused keeping its memory here: "
            f"{_why(support.missing, 'no freezer')}; pause it with memory=false to keep its "
            "files only"
        )
    if not memory and not support.checkpoints:
        raise StateUnsupported(
            f"sandbox {sandbox_id} cannot be paused to disk here: "
            f"{_why(support.missing, 'no writable layer to save')}"
        )


def _why(missing: tuple[str, ...], default: str) -> str:
    return "; ".join(missing) or default


def ended_here(sandbox: Sandbox) -> Sandbox:
    """``sandbox`` (not live in this process), unless the store says it runs, or is
    frozen: then another replica holds it (a restart marks this process's own as failed
    before it serves).

    Raises:
        SandboxElsewhere: it runs (or is frozen) on another replica.
    """
    if sandbox.state is SandboxState.RUNNING or (
        sandbox.state is SandboxState.PAUSED and sandbox.memory
    ):
        raise SandboxElsewhere(
            f"sandbox {sandbox.id} runs on another Ringfence replica, which alone can reach "
            "it: send its requests there (route by sandbox id)"
        )
    return sandbox
