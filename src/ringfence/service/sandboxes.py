"""Interactive sandboxes for tenants: recorded in the store, run by a sandbox runtime.

A sandbox id is random and unique across tenants; a tenant asking for another tenant's
sandbox gets "not found", exactly as for an id that never existed. The store holds every
sandbox ever created; the live table holds the ones this process runs, with the client that
reaches each one's daemon. When a sandbox ends (kill, expiry, or its daemon dying), the
final state is stored and nothing of it remains on the host.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import functools
import logging
import secrets
from collections.abc import Collection, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ringfence.audit.chain import SYSTEM
from ringfence.backends import LaunchSpec, LiveSandbox, SandboxRuntime
from ringfence.config import Config
from ringfence.errors import (
    CheckpointNotFound,
    ExecutionNotFound,
    InvalidRequest,
    RingfenceError,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    ServerAtCapacity,
    StateUnsupported,
    TooManyRequests,
)
from ringfence.models import (
    ExecutionResult,
    NetworkMode,
    NetworkPolicy,
    ResourceLimits,
    Sandbox,
    SandboxSpec,
    SandboxState,
    Status,
)
from ringfence.network.gateway import EgressGateway
from ringfence.network.session import Asker, Requester, SessionLookup, requesting
from ringfence.policy.limits import check_limits, check_timeout, defaults_for
from ringfence.policy.network import check_tenant_policy, policy_for
from ringfence.service.audit import AuditLog
from ringfence.service.budget import Amount, Budget, Reservation
from ringfence.service.credentials import CredentialKey
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.groups import GROUP_PROXY, GROUP_PROXY_VARIABLE, GroupRelays
from ringfence.service.pool import PoolStats, Warm, WarmPool
from ringfence.service.ports import Ports
from ringfence.service.sandbox_calls import SandboxCalls
from ringfence.service.sandbox_pausing import (
    DAEMON_START_SECONDS,
    LiveEntry,
    Pausing,
    check_lifecycle,
    deadline_of,
    ended_here,
    live_timeout,
)
from ringfence.service.sandbox_projects import (
    SandboxProjects,
    bind_project,
    check_project,
    roots_of,
)
from ringfence.service.sandbox_state import SandboxStates
from ringfence.service.state_files import StateFiles
from ringfence.service.usage import SandboxUsage
from ringfence.service.volumes import VolumeService
from ringfence.store import Store
from ringfence.templates import DAEMON_PYTHON, TemplateNotFound, has_program
from ringfence.templates import resolve as resolve_template

__all__ = [
    "FROZEN_LOST_ERROR",
    "RESTART_ERROR",
    "SANDBOX_ID_VARIABLE",
    "SandboxService",
    "template_image",
]

log = logging.getLogger(__name__)

# Set in every sandbox: commands may want to know where they run.
SANDBOX_ID_VARIABLE = "RINGFENCE_SANDBOX_ID"
RESTART_ERROR = "the server stopped while this sandbox ran; the sandbox was killed with it"
FROZEN_LOST_ERROR = (
    "the server stopped without shutting down while this sandbox was paused keeping its "
    "memory (memory=true): its processes and memory were lost with it (a clean shutdown "
    "saves a frozen sandbox's files to disk; pause with memory=false to survive a crash)"
)
# Without a built template of that name, "base" is the host's system directories.
_BUILTIN_TEMPLATE = "base"


class SandboxService(Pausing):
    """Create, find, extend and kill interactive sandboxes on behalf of tenants."""

    def __init__(
        self,
        store: Store,
        runtime: SandboxRuntime | None,
        config: Config,
        audit: AuditLog | None = None,
        pool: WarmPool | None = None,
        *,
        budget: Budget,
        egress_asker: Asker | None = None,
        egress_gateway: SessionLookup | None = None,
        credentials: CredentialKey | None = None,
        volumes: VolumeService | None = None,
    ) -> None:
        """``runtime`` None: this server's backend cannot run interactive sandboxes.
        ``audit`` None: nothing is recorded. ``pool``: ready sandboxes to claim.
        ``budget``: what tenants and the server may hold; the server's execution service
        must be given the same one, or sandboxes and executions are not counted together
        (so there is no default). ``egress_asker``: who is asked about "ask" egress rules
        (None: they are denied). ``egress_gateway``: where a running sandbox's egress
        session is found to change its policy (None: ``set_network`` changes none live).
        ``credentials``: seals what a sandbox paused to disk keeps of its environment and
        egress policy (None: a key of this process, so such a sandbox cannot be resumed
        after a restart). ``volumes``: the tenants' volumes sandboxes mount (None: a
        sandbox naming one is refused)."""
        self._store = store
        self._runtime = runtime
        self._config = config
        self._audit = audit
        self._pool = pool
        self._budget = budget
        self._live: dict[str, LiveEntry] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        self.calls = SandboxCalls(  # commands, files and code, passed to the daemons
            self, archive_max_bytes=config.archive_max_bytes
        )
        self.ports = Ports(self, config.max_port_connections_per_sandbox)  # preview URLs
        self.groups = GroupRelays(self.ports)  # grouped sandboxes reach each other's ports
        self.files = StateFiles(config.data_dir, credentials or CredentialKey.generate())
        self.state = SandboxStates(self, store, self.files)  # checkpoints, snapshots, fork
        self.projects = SandboxProjects(self)  # diff and sync of project views
        self.usage = SandboxUsage(self)  # metrics: read when asked
        self._locks: dict[str, asyncio.Lock] = {}  # one pause or resume at a time, by id
        self._egress_asker = egress_asker
        self._egress_gateway = egress_gateway
        self.volumes = volumes or VolumeService(store, None, config, missing="none on this server")

    @property
    def config(self) -> Config:
        """The settings it decides by (the API's document states their ceilings)."""
        return self._config

    def start(self) -> None:
        """Start filling the warm pool (in the event loop that serves)."""
        if self._pool is not None:
            self._pool.start()

    def pool_stats(self) -> dict[str, PoolStats]:
        return self._pool.stats() if self._pool is not None else {}

    def running_count(self) -> int:
        """Sandboxes running here (a frozen one does not run)."""
        return sum(entry.frozen is None for entry in self._live.values())

    async def reconcile(self) -> int:
        """After a restart: sandboxes recorded as running died with the server that ran
        them (``--die-with-parent``; the runtime sweeps what they left), and so did frozen
        ones (paused keeping memory) if it crashed; sandboxes paused to disk survive.
        Returns how many were marked failed."""
        ended = await self._store.end_running_sandboxes(
            RESTART_ERROR, frozen_error=FROZEN_LOST_ERROR
        )
        for tenant, sandbox in ended:
            log.warning("sandbox %s/%s was cut off by a restart", tenant, sandbox.id)
        return len(ended)

    def check_policy(self, spec: SandboxSpec, tenant: str | None = None) -> str:
        """The root filesystem of the spec's template, if the spec is allowed here (for
        ``tenant``: the rules of its default policy are the operator's, never refused).

        Raises:
            InvalidRequest: no such template, limits or timeout above the ceilings, a
                network policy that reaches internal networks the operator did not allow,
                or a project outside the operator's project roots.
        """
        try:
            image = self.image_for(spec.template)
        except TemplateNotFound as exc:  # in a create, a bad field: 400, not 404
            raise InvalidRequest(f"template: {exc.message}") from exc
        if image != self._config.default_image and not has_program(Path(image), DAEMON_PYTHON):
            raise InvalidRequest(
                f"template: {spec.template!r} has no python3 ({DAEMON_PYTHON}), which an "
                "interactive sandbox runs its daemon on; build it with python3 "
                "(ringfence template build --packages python3), or use it for one-shot "
                "executions"
            )
        check_limits(spec.limits, self._config)
        check_timeout(spec.timeout, self._config)
        check_tenant_policy(spec.network, self._config, tenant)
        check_project(spec, self._config, tenant)
        return image

    def image_for(self, template: str) -> str:
        """Raises ``TemplateNotFound`` or ``TemplateUnusable`` (see ``template_image``)."""
        return template_image(template, self._config)

    async def create(self, tenant: str, spec: SandboxSpec, *, actor: str = SYSTEM) -> Sandbox:
        """Start a sandbox and return it once its daemon answers.

        Raises:
            InvalidRequest: the spec is not allowed here.
            TooManyRequests: the tenant's budget (sandboxes and executions, memory, CPU)
                has no room for it.
            ServerAtCapacity: the server's totals have no room for it.
            SandboxError: the sandbox could not start (recorded as failed, with why).
            SandboxUidsExhausted: every host uid for sandboxes is taken (recorded as failed).
            CheckpointNotFound: ``spec.snapshot`` names no snapshot of the tenant's.
            StateUnsupported: ``auto_pause`` or ``on_timeout="pause"`` (or a snapshot) on a
                backend that cannot capture state (recorded as failed).
        """
        restore = None
        if spec.snapshot is not None:
            spec, restore = await self._from_snapshot(tenant, spec)
        return await self.create_from(tenant, spec, actor=actor, restore=restore)

    async def create_from(
        self,
        tenant: str,
        spec: SandboxSpec,
        *,
        actor: str = SYSTEM,
        restore: Path | None = None,
        held: list[Reservation] | None = None,
    ) -> Sandbox:
        """``create``, on the files of ``restore`` (an export of this server's) if given:
        the start of a fork's child, or of a sandbox from a snapshot. ``held``: its
        tenant's and host's shares, reserved already (a fork reserves all its children's
        before it starts any); taken over (released here if it does not start)."""
        if held is None:
            defaults = defaults_for(spec.template, self._config)
            amount = self._budget.amount(spec.limits.merged_over(defaults))
            # The tenant's share now; the host's once it is known whether the pool serves it
            # (a pooled sandbox holds its own). Handed to its live entry (emptied here) once
            # it runs, and given back by the watcher at its end.
            held = [self._budget.reserve(tenant, amount, on_host=False)]
        try:
            return await self._create(tenant, spec, actor, held, restore)
        finally:
            for reservation in held:
                self._budget.release(reservation)

    async def _from_snapshot(self, tenant: str, spec: SandboxSpec) -> tuple[SandboxSpec, Path]:
        """``spec`` on its snapshot's template, and where the snapshot's files are.

        Raises:
            CheckpointNotFound: no such snapshot in this tenant.
            InvalidRequest: ``spec`` names another template than the snapshot's.
        """
        assert spec.snapshot is not None
        snapshot = await self._store.get_snapshot(tenant, spec.snapshot)
        if snapshot is None:
            raise CheckpointNotFound(f"no snapshot with id {spec.snapshot!r}")
        if "template" in spec.model_fields_set and spec.template != snapshot.template:
            raise InvalidRequest(
                f"template: snapshot {snapshot.id} is of template {snapshot.template!r}; "
                "leave template out (the snapshot's is used)"
            )
        return spec.model_copy(update={"template": snapshot.template}), self.files.snapshot(
            snapshot.id
        )

    async def _create(
        self,
        tenant: str,
        spec: SandboxSpec,
        actor: str,
        held: list[Reservation],
        restore: Path | None,
    ) -> Sandbox:
        image = self.check_policy(spec, tenant)
        if self._runtime is None:
            raise InvalidRequest(
                f"the {self._config.backend} backend cannot run interactive sandboxes "
                "(use SANDBOX_BACKEND=local)"
            )
        timeout = spec.timeout or min(
            self._config.default_sandbox_timeout, self._config.max_timeout
        )
        network = policy_for(tenant, spec.network, self._config)
        now = datetime.now(UTC)
        sandbox = Sandbox(
            id=_new_id(),
            template=spec.template,
            state=SandboxState.RUNNING,
            metadata=spec.metadata,
            limits=spec.limits.merged_over(defaults_for(spec.template, self._config)),
            network=network.redacted(),  # header values (credentials) are never stored
            created_at=now,
            expires_at=now + timedelta(seconds=timeout),
            auto_pause=spec.auto_pause,
            on_timeout=spec.on_timeout,
            auto_resume=spec.auto_resume,
            snapshot=spec.snapshot,
            volumes=spec.volumes,
            public_traffic=spec.public_traffic,
            group=spec.group,
        )
        project = None
        if spec.project is not None:  # resolved: the record names the directory shown
            project = bind_project(
                spec.project,
                roots_of(self._config, tenant),
                self._config.allow_root_owned_projects,
            )
            shown = spec.project.model_copy(update={"source": str(project.source)})
            sandbox = sandbox.model_copy(update={"project": shown})
        # Its volumes stay leased (undeletable) until its record, naming them, is stored.
        async with self.volumes.bound(tenant, spec.volumes) as volumes:
            launch = LaunchSpec(
                image=image,
                env={**spec.env, **_grouped(spec), SANDBOX_ID_VARIABLE: sandbox.id},
                limits=sandbox.limits,
                timeout=timeout,
                network=network,
                restore=restore,
                volumes=volumes,
                project=project,
            )
            return await self._start(tenant, spec, actor, held, sandbox, launch, network)

    async def _start(
        self,
        tenant: str,
        spec: SandboxSpec,
        actor: str,
        held: list[Reservation],
        sandbox: Sandbox,
        launch: LaunchSpec,
        network: NetworkPolicy,
    ) -> Sandbox:
        """``_create``'s second half: claim a warm sandbox or start one, record it."""
        runtime = self._runtime
        assert runtime is not None, "_create refuses a server without a runtime"
        restore, timeout = launch.restore, launch.timeout
        # A warm sandbox has no mounts; it is started before anyone asks for them. It runs
        # with its template's limits and no network: a create of the same claims one.
        pooled = not launch.volumes and launch.project is None
        if self._pool is not None and restore is None and pooled:
            same_limits = sandbox.limits == self._pool.limits(spec.template)
            # A networked template's pooled sandboxes (deny-all until claimed) serve creates
            # with a network policy, handed over at the claim; the others, creates without.
            networked = network.mode is not NetworkMode.NONE
            same_network = networked == self._pool.networked(spec.template) and (
                not networked or self._egress_gateway is not None
            )
            if same_limits and same_network:
                warm = self._pool.claim(spec.template)
                if warm is not None:
                    if warm.reservation is not None:
                        held.append(warm.reservation)
                    return await self._bind(warm, tenant, sandbox, spec, launch, actor, held)
            else:
                self._pool.pass_over(spec.template)
        if not any(reservation.on_host for reservation in held):
            held.append(await self._reserve_host(self._budget.amount(sandbox.limits)))
        # Recorded while it starts (time to interactive is a goal). A crash before the
        # record lands loses nothing: the sandbox dies with the server (--die-with-parent).
        recorded = asyncio.create_task(self._store.add_sandbox(tenant, sandbox))
        described = {
            "template": spec.template,
            "timeout": timeout,
            "env": sorted(spec.env),  # names only: values may be secrets
            "metadata": spec.metadata,
            "limits": sandbox.limits.model_dump(mode="json"),
            "network": sandbox.network.model_dump(mode="json"),
            **({"volumes": [m.model_dump() for m in spec.volumes]} if spec.volumes else {}),
            **_lifecycle_details(sandbox),
        }
        requester = Requester(
            tenant, f"sandbox:{sandbox.id}", actor, self._audit, self._egress_asker
        )
        try:
            with requesting(requester):  # whose egress the proxy audits and asks about
                live = await runtime.start(deadline_of(launch, sandbox))
        except RingfenceError as exc:
            await recorded
            failed = sandbox.ended(SandboxState.FAILED, exc.message)
            await self._store.update_sandbox(tenant, failed)
            self.record(tenant, actor, "sandbox.create", sandbox.id, "failed", described)
            if isinstance(exc, TooManyRequests):  # no room on the host (no free uid): retry
                raise
            raise SandboxError(f"the sandbox could not start: {exc.message}") from exc
        except BaseException:  # cancelled: the runtime has stopped what it started
            await asyncio.shield(self._abandoned(tenant, sandbox, recorded))
            raise
        # From here on the watcher stores how it ends, whatever happens to this call.
        entry = self._adopt(tenant, sandbox, live, launch, held)
        daemon = entry.daemon
        try:
            await recorded
            check_lifecycle(sandbox, live)
            await daemon.health(DAEMON_START_SECONDS)
        except StateUnsupported as exc:
            entry.failure = exc.message
            await live.kill()
            await asyncio.shield(entry.ended)
            self.record(tenant, actor, "sandbox.create", sandbox.id, "failed", described)
            raise
        except SandboxNotRunning as exc:
            entry.failure = f"the sandbox daemon did not start: {exc.message}"
            await live.kill()
            ended = await asyncio.shield(entry.ended)
            self.record(tenant, actor, "sandbox.create", sandbox.id, "failed", described)
            raise SandboxError(ended.error or entry.failure) from exc
        except BaseException:  # the store failed, or this call was cancelled
            entry.failure = "its creation was interrupted"
            await asyncio.shield(live.kill())
            raise
        self.record(tenant, actor, "sandbox.create", sandbox.id, "ok", described)
        self._start_lifecycle(sandbox, entry)
        return sandbox

    def _adopt(
        self,
        tenant: str,
        sandbox: Sandbox,
        live: LiveSandbox,
        launch: LaunchSpec,
        held: list[Reservation],
    ) -> LiveEntry:
        """Enter a started sandbox in the live table, with what it holds (``held``,
        emptied: released by its watcher, at its end), and watch for its end."""
        loop = asyncio.get_running_loop()
        entry = LiveEntry(
            tenant, live, DaemonClient(sandbox.id, live.socket_path), loop.create_future(),
            launch, deadline=loop.time() + launch.timeout, touched=loop.time(),
        )  # fmt: skip
        entry.reservations, held[:] = held[:], []
        self._live[sandbox.id] = entry
        watcher = asyncio.create_task(self._watch(sandbox, entry))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return entry

    async def reserve(self, tenant: str, limits: ResourceLimits) -> list[Reservation]:
        """A sandbox of ``limits``'s shares of its tenant's budget and the server's, for
        ``create_from(held=...)``; give them back with ``release`` if unused.

        Raises:
            TooManyRequests, ServerAtCapacity: there is no room for it now.
        """
        amount = self._budget.amount(limits)
        held = [self._budget.reserve(tenant, amount, on_host=False)]
        try:
            held.append(await self._reserve_host(amount))
        except BaseException:
            self._budget.release(held[0])
            raise
        return held

    def release(self, held: Collection[Reservation]) -> None:
        """Give back what ``reserve`` held (each once; a second release does nothing)."""
        for reservation in held:
            self._budget.release(reservation)

    async def _reserve_host(self, amount: Amount) -> Reservation:
        """A share of the server's totals; idle pooled sandboxes are evicted to make room
        before a tenant is told the server is full.

        Raises:
            ServerAtCapacity: there is no room, even with the pool emptied.
        """
        while True:
            try:
                return self._budget.reserve(None, amount)
            except ServerAtCapacity:
                if self._pool is None or not await self._pool.evict():
                    raise

    async def _bind(
        self,
        warm: Warm,
        tenant: str,
        sandbox: Sandbox,
        spec: SandboxSpec,
        launch: LaunchSpec,
        actor: str,
        held: list[Reservation],
    ) -> Sandbox:
        """Make a pooled sandbox the claimer's: its id, environment and timeout.

        A claim is meant to take milliseconds, so two of its steps finish after it is
        answered. The record (a SQLite write alone takes 2-5 ms here): until it is written,
        this service's own readers (``get``, ``list``, ``set_timeout``, the watcher) wait
        for it. The environment (the daemon's ``/init``, ~1 ms): every request to the
        daemon waits for it, so nothing runs before it is set. Should either fail, the
        sandbox is killed: none runs unrecorded or with another claim's environment. A crash
        before the record lands loses a sandbox that died with the server anyway.
        """
        warm.daemon.sandbox_id = sandbox.id
        timeout = launch.timeout
        loop = asyncio.get_running_loop()
        entry = LiveEntry(
            tenant, warm.live, warm.daemon, loop.create_future(), launch,
            deadline=loop.time() + timeout, touched=loop.time(),
        )  # fmt: skip
        entry.reservations, held[:] = held[:], []  # released by the watcher, at its end
        entry.recorded = asyncio.create_task(self._store.add_sandbox(tenant, sandbox))
        initialized = warm.daemon.start_init(
            {**spec.env, **_grouped(spec), SANDBOX_ID_VARIABLE: sandbox.id}
        )
        entry.recorded.add_done_callback(
            functools.partial(self._kill_on_failure, entry, what="its record")
        )
        initialized.add_done_callback(
            functools.partial(self._kill_on_failure, entry, what="its environment")
        )
        self._live[sandbox.id] = entry
        watcher = asyncio.create_task(self._watch(sandbox, entry))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        try:
            if warm.egress_subject is not None:
                self._hand_egress_over(warm.egress_subject, tenant, sandbox.id, actor, launch)
            check_lifecycle(sandbox, warm.live)
            await warm.live.set_timeout(deadline_of(launch, sandbox).timeout)
        except BaseException as exc:
            entry.failure = entry.failure or f"its claim from the pool failed: {exc}"
            await asyncio.shield(warm.live.kill())
            raise
        for step in (entry.recorded, initialized):  # failed already: it is being killed
            if (failure := _failure(step)) is not None:
                raise failure
        details = {"template": spec.template, "timeout": timeout, "pooled": True,
                   "env": sorted(spec.env), "metadata": spec.metadata,
                   **_lifecycle_details(sandbox)}  # fmt: skip
        self.record(tenant, actor, "sandbox.create", sandbox.id, "ok", details)
        self._start_lifecycle(sandbox, entry)
        return sandbox

    def _hand_egress_over(
        self, subject: str, tenant: str, sandbox_id: str, actor: str, launch: LaunchSpec
    ) -> None:
        """Make a pooled sandbox's egress session (deny-all, keyed by its placeholder
        ``subject``) the claimer's: its records, asks and policy.

        Raises:
            SandboxError: there is no such session (the claim then kills the sandbox).
        """
        requester = Requester(
            tenant, f"sandbox:{sandbox_id}", actor, self._audit, self._egress_asker
        )
        gateway = self._egress_gateway  # only the local backend's pools networked templates
        session = None
        if isinstance(gateway, EgressGateway):
            session = gateway.rebind("", subject, requester)
        if session is None or launch.network is None:
            raise SandboxError("its egress session could not be handed over")
        session.set_policy(launch.network)

    def _kill_on_failure(self, entry: LiveEntry, step: asyncio.Task[None], *, what: str) -> None:
        """Kill a claimed sandbox whose ``what`` (a step finished after the claim) failed."""
        failure = _failure(step)
        if failure is None:
            return
        if entry.killing:  # the kill asked for interrupted it: no failure of its own
            return
        log.error("a pooled sandbox's %s failed; killing it: %s", what, failure)
        entry.failure = entry.failure or f"{what} could not be set up: {failure}"
        killing = asyncio.create_task(_kill(entry.live))
        self._watchers.add(killing)
        killing.add_done_callback(self._watchers.discard)

    async def _abandoned(self, tenant: str, sandbox: Sandbox, recorded: asyncio.Task[None]) -> None:
        """Store the end of a sandbox whose creation was given up before it ran."""
        await asyncio.gather(recorded, return_exceptions=True)
        if not recorded.cancelled() and recorded.exception() is None:
            interrupted = sandbox.ended(SandboxState.FAILED, "its creation was interrupted")
            with contextlib.suppress(RingfenceError):
                await self._store.update_sandbox(tenant, interrupted)

    async def get(self, tenant: str, sandbox_id: str) -> Sandbox:
        """Raises ``SandboxNotFound`` (also for another tenant's sandbox)."""
        entry = self._live.get(sandbox_id)
        if entry is not None and entry.tenant == tenant:
            await entry.record_written()
        sandbox = await self._store.get_sandbox(tenant, sandbox_id)
        if sandbox is None:
            raise SandboxNotFound(f"no sandbox with id {sandbox_id!r}")
        return sandbox

    async def list(
        self,
        tenant: str,
        *,
        states: Collection[SandboxState] | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 100,
    ) -> list[Sandbox]:
        await asyncio.gather(
            *(e.record_written() for e in self._live.values() if e.tenant == tenant)
        )
        return await self._store.list_sandboxes(
            tenant, states=states, metadata=metadata, limit=limit
        )

    async def set_timeout(
        self, tenant: str, sandbox_id: str, timeout: float, *, actor: str = SYSTEM
    ) -> Sandbox:
        """The sandbox will be killed ``timeout`` seconds from now (sooner or later than
        before).

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
            SandboxNotRunning: it has ended (or is paused, created with auto_resume off).
            InvalidRequest: the timeout is above the operator's ceiling.

        A paused sandbox is resumed first (as by any request).
        """
        check_timeout(timeout, self._config)
        entry = await self._awake(tenant, sandbox_id, actor)
        async with entry.writing:  # the end, stored by the watcher, is never overwritten
            if entry.ending:
                raise SandboxNotRunning(f"sandbox {sandbox_id} is ending")
            sandbox = await self.get(tenant, sandbox_id)
            try:
                await entry.live.set_timeout(live_timeout(sandbox, timeout))
            except ExecutionNotFound:  # its run ended (and was forgotten) just now
                raise SandboxNotRunning(f"sandbox {sandbox_id} has ended") from None
            entry.deadline = asyncio.get_running_loop().time() + timeout
            entry.moved.set()  # on_timeout="pause": its lifecycle wakes for the new deadline
            moved = sandbox.model_copy(
                update={"expires_at": datetime.now(UTC) + timedelta(seconds=timeout)}
            )
            await self._store.update_sandbox(tenant, moved)
        self.record(tenant, actor, "sandbox.set_timeout", sandbox_id, details={"timeout": timeout})
        return moved

    async def set_network(
        self, tenant: str, sandbox_id: str, policy: NetworkPolicy, *, actor: str = SYSTEM
    ) -> Sandbox:
        """Replace the egress policy of a running sandbox (connections from now on).

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
            SandboxNotRunning: it has ended.
            InvalidRequest: it was created without network (nothing to change in place).
        """
        check_tenant_policy(policy, self._config, tenant)
        policy = policy_for(tenant, policy, self._config)  # under the operator's floor
        entry = await self._awake(tenant, sandbox_id, actor)
        gateway = self._egress_gateway
        session = gateway.session(tenant, f"sandbox:{sandbox_id}") if gateway else None
        if session is None:
            raise InvalidRequest(
                "network: this sandbox was created without network (mode none); create one "
                "with a network policy to change it later"
            )
        async with entry.writing:  # the end, stored by the watcher, is never overwritten
            if entry.ending:
                raise SandboxNotRunning(f"sandbox {sandbox_id} is ending")
            sandbox = await self.get(tenant, sandbox_id)
            changed = sandbox.model_copy(update={"network": policy.redacted()})
            await self._store.update_sandbox(tenant, changed)
            session.set_policy(policy)
            entry.launch = dataclasses.replace(entry.launch, network=policy)  # a resume's
        if self._audit is not None:
            await self._audit.record_now(
                tenant, actor, "sandbox.network", f"sandbox:{sandbox_id}",
                details={"network": changed.network.model_dump(mode="json")},
            )  # fmt: skip
        return changed

    async def kill(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> Sandbox:
        """Kill every process of the sandbox and remove everything of it; an ended sandbox
        is returned unchanged.

        A paused one is killed too: a frozen one's processes, a disk one's saved files.

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
        """
        async with self._lock(sandbox_id):  # not while it is being paused or resumed
            entry = self._live.get(sandbox_id)
            if entry is not None and entry.tenant == tenant:
                ended = await self._kill_live(entry, sandbox_id, actor)
                if ended.state is not SandboxState.PAUSED:
                    return ended
                # A resume that failed left it paused to disk: its saved files go too.
            sandbox = await self.get(tenant, sandbox_id)
            if sandbox.state is not SandboxState.PAUSED or sandbox.memory:
                return ended_here(sandbox)
            self.record(tenant, actor, "sandbox.kill", sandbox_id, details={"paused": True})
            killed = sandbox.ended(SandboxState.KILLED)
            await self._store.update_sandbox(tenant, killed)
            self.files.forget_paused(sandbox_id)
            return killed

    async def _kill_live(self, entry: LiveEntry, sandbox_id: str, actor: str) -> Sandbox:
        """Kill a sandbox of the live table (its lock held) and return its stored end.

        The intent is set before anything is awaited, so whatever the kill interrupts (a
        claimed sandbox's record or ``/init`` still in flight) ends it as killed, not as
        that step's failure; the record is awaited first, so the end has one to update.
        """
        if not entry.ended.done():
            entry.killing = True
            await entry.record_written()
            self.record(entry.tenant, actor, "sandbox.kill", sandbox_id)
            await entry.live.thaw()  # a frozen process dies only once it runs again
            await entry.live.kill()
        ended = await asyncio.shield(entry.ended)
        if ended.state is SandboxState.KILLED:
            self.files.forget_paused(sandbox_id)  # a failed resume's files, if it left any
        return ended

    async def daemon(self, tenant: str, sandbox_id: str) -> DaemonClient:
        """The client of a running sandbox's daemon; a paused sandbox is resumed first
        (once, however many requests wait for it), unless made with auto_resume off. Every
        request passed to a sandbox comes here: it is what "idle" (``auto_pause``) counts.

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
            SandboxNotRunning: it has ended, or is paused and made with auto_resume off.
            What ``resume`` raises, when it was paused.
        """
        return (await self._awake(tenant, sandbox_id, SYSTEM)).daemon

    async def live(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> LiveSandbox:
        """The runtime's handle on a running sandbox (resumed first if paused), for the
        operations on its state (``service.sandbox_state``).

        Raises:
            SandboxNotFound, SandboxNotRunning: as ``daemon``.
        """
        entry = await self._awake(tenant, sandbox_id, actor)
        # What it is for freezes the sandbox (a checkpoint, a rollback, a fork, an export):
        # never with a claim's /init unread, which a kill while frozen turns into a reset
        # that fails the claim (a pause waits the same way, design 6).
        await entry.daemon.initialized()
        return entry.live

    async def running_live(self, tenant: str, sandbox_id: str) -> LiveSandbox:
        """The runtime's handle on a sandbox running here, frozen or not, to read (its
        metrics): never resumed, and no request to it (``auto_pause`` does not count it).

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
            SandboxNotRunning: it has ended, or is paused to disk.
        """
        return (await self._running(tenant, sandbox_id)).live

    def running_sandboxes(self) -> builtins.list[tuple[str, str, LiveSandbox]]:
        """(tenant, sandbox id, handle) of every sandbox running here, frozen ones too."""
        return [
            (entry.tenant, sandbox_id, entry.live)
            for sandbox_id, entry in self._live.items()
            if not entry.ended.done() and entry.pausing is None
        ]

    def touch(self, sandbox_id: str) -> None:
        """Count now as a request to the sandbox, for ``auto_pause`` (traffic through its
        ports: an open WebSocket is use, not idleness)."""
        entry = self._live.get(sandbox_id)
        if entry is not None:
            entry.touched = asyncio.get_running_loop().time()

    def live_tenant(self, sandbox_id: str) -> str | None:
        """The tenant of a sandbox this process runs (frozen included), or None."""
        entry = self._live.get(sandbox_id)
        return entry.tenant if entry is not None and not entry.ended.done() else None

    def launch_of(self, tenant: str, sandbox_id: str) -> LaunchSpec:
        """How a sandbox running here was started, values included (for its fork's
        children only): its environment without the variable of its own id.

        Raises:
            SandboxNotRunning: it does not run here.
        """
        entry = self._live.get(sandbox_id)
        if entry is None or entry.tenant != tenant or entry.ended.done():
            raise SandboxNotRunning(f"sandbox {sandbox_id} does not run")
        env = {k: v for k, v in entry.launch.env.items() if k != SANDBOX_ID_VARIABLE}
        return dataclasses.replace(entry.launch, env=env)

    def record(
        self,
        tenant: str,
        actor: str,
        action: str,
        sandbox_id: str,
        outcome: str = "ok",
        details: Mapping[str, object] | None = None,
    ) -> None:
        """Put something done to a sandbox on the audit record (also for the routes that
        pass commands and files through)."""
        if self._audit is not None:
            self._audit.record(tenant, actor, action, f"sandbox:{sandbox_id}", outcome, details)

    async def aclose(self) -> None:
        """Kill every sandbox (and the pool's) and wait until each end is stored."""
        await self.usage.aclose()
        if self._pool is not None:
            await self._pool.aclose()
        for sandbox_id, entry in list(self._live.items()):
            if entry.frozen is not None:  # its memory cannot outlive us: its files can
                try:
                    await self.pause(entry.tenant, sandbox_id, memory=False, reason="shutdown")
                except Exception:  # boundary: the rest must still be stopped
                    log.exception("could not save frozen sandbox %s to disk", sandbox_id)
        entries = list(self._live.values())
        await asyncio.gather(*(e.live.thaw() for e in entries), return_exceptions=True)
        await asyncio.gather(*(e.live.kill() for e in entries), return_exceptions=True)
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await self.groups.aclose()
        if self._runtime is not None:
            await self._runtime.aclose()

    async def _running(self, tenant: str, sandbox_id: str) -> LiveEntry:
        """Its live entry (frozen or not). Raises ``SandboxNotFound``, ``SandboxNotRunning``
        (ended, or paused to disk), ``SandboxElsewhere``."""
        entry = self._live.get(sandbox_id)
        if entry is not None and entry.tenant == tenant and not entry.ended.done():
            return entry
        sandbox = ended_here(await self.get(tenant, sandbox_id))  # SandboxNotFound, too
        if sandbox.state is SandboxState.PAUSED:
            raise SandboxNotRunning(f"sandbox {sandbox_id} is paused: resume it first")
        raise SandboxNotRunning(f"sandbox {sandbox_id} has ended ({sandbox.state.value})")

    async def _awake(self, tenant: str, sandbox_id: str, actor: str) -> LiveEntry:
        """Its live entry, running: resumed first when paused and made with auto_resume."""
        entry = self._live.get(sandbox_id)
        if entry is not None and entry.tenant == tenant and entry.awake:
            entry.touched = asyncio.get_running_loop().time()
            return entry
        async with self._lock(sandbox_id):  # a pause finishes first; one resume for all
            entry = self._live.get(sandbox_id)
            if entry is None or entry.tenant != tenant or not entry.awake:
                sandbox = await self.get(tenant, sandbox_id)
                if sandbox.state is SandboxState.PAUSED and not sandbox.auto_resume:
                    raise SandboxNotRunning(
                        f"sandbox {sandbox_id} is paused and was created with auto_resume "
                        "off: resume it first"
                    )
                if sandbox.state is SandboxState.PAUSED:
                    await self._resume(tenant, sandbox, actor, implicit=True)
                entry = await self._running(tenant, sandbox_id)
            entry.touched = asyncio.get_running_loop().time()
            return entry

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    async def _watch(self, sandbox: Sandbox, entry: LiveEntry) -> None:
        """Serve its group's relay, if it has a group; wait for the end; store it; release
        the daemon client."""
        ended = sandbox.ended(SandboxState.FAILED, "internal error")
        if sandbox.group is not None:
            self.groups.start(entry.tenant, sandbox.id, sandbox.group, entry.daemon)
        try:
            result = await entry.live.ended()
            state, error = _ending(result)
            killed = entry.killing  # asked for before it ended: killed, however it died
            if entry.failure is not None:  # failing before any kill was asked for
                state, error = SandboxState.FAILED, entry.failure
            elif killed:
                state, error = SandboxState.KILLED, None
            await entry.record_written()
            async with entry.writing:
                entry.ending = True
                if entry.pausing is not None and entry.failure is None and not killed:  # saved
                    ended = entry.pausing
                else:
                    current = await self._store.get_sandbox(entry.tenant, sandbox.id) or sandbox
                    ended = current.ended(state, error)
                    self.record(
                        entry.tenant, SYSTEM, "sandbox.end", sandbox.id, state.value,
                        {"error": error},
                    )  # fmt: skip
                await self._store.update_sandbox(entry.tenant, ended)
        except Exception:  # boundary: whatever happens, the sandbox must end here
            log.exception("could not store the end of sandbox %s/%s", entry.tenant, sandbox.id)
        finally:
            del self._live[sandbox.id]
            if ended.state.is_terminal:
                self._locks.pop(sandbox.id, None)
            for reservation in entry.reservations:
                self._budget.release(reservation)
            await self.groups.stop(sandbox.id)
            await entry.daemon.aclose()
            entry.ended.set_result(ended)


def template_image(template: str, config: Config) -> str:
    """The root filesystem of ``template`` (``base``: the host's, unless one is built).

    Raises:
        TemplateNotFound: no such template.
        TemplateUnusable: it exists but the sandbox user cannot use it safely.
    """
    try:
        return resolve_template(template, config)
    except TemplateNotFound:
        if template == _BUILTIN_TEMPLATE:
            return config.default_image
        raise


def _lifecycle_details(sandbox: Sandbox) -> dict[str, object]:
    details: dict[str, object] = {}
    if sandbox.auto_pause is not None:
        details["auto_pause"] = sandbox.auto_pause
    if sandbox.on_timeout != "kill":
        details["on_timeout"] = sandbox.on_timeout
    if not sandbox.auto_resume:
        details["auto_resume"] = False
    if sandbox.snapshot is not None:
        details["snapshot"] = sandbox.snapshot
    if sandbox.project is not None:
        details["project"] = sandbox.project.model_dump()
    return details


def _ending(result: ExecutionResult) -> tuple[SandboxState, str | None]:
    """How a sandbox ended, from the end of its daemon's execution."""
    if result.status is Status.CANCELLED:
        return SandboxState.KILLED, None
    if result.status is Status.TIMED_OUT:
        return SandboxState.EXPIRED, None
    if result.error:
        return SandboxState.FAILED, result.error
    tail = result.logs.strip().splitlines()[-1:] or [""]
    return SandboxState.FAILED, f"the sandbox daemon exited ({result.exit_code}): {tail[0][:300]}"


def _failure(step: asyncio.Task[None]) -> BaseException | None:
    """Why ``step`` failed, if it has (a cancelled step is no failure)."""
    if not step.done() or step.cancelled():
        return None
    return step.exception()


async def _kill(live: LiveSandbox) -> None:
    await live.kill()


def _grouped(spec: SandboxSpec) -> dict[str, str]:
    """The variable a grouped sandbox finds its group's proxy by (docs/design.md 14.6)."""
    return {GROUP_PROXY_VARIABLE: GROUP_PROXY} if spec.group is not None else {}


def _new_id() -> str:
    return "sb" + secrets.token_hex(10)
