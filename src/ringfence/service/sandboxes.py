"""Interactive sandboxes for tenants: recorded in the store, run by a sandbox runtime.

A sandbox id is random and unique across tenants; a tenant asking for another tenant's
sandbox gets "not found", exactly as for an id that never existed. The store holds every
sandbox ever created; the live table holds the ones this process runs, with the client that
reaches each one's daemon. When a sandbox ends (kill, expiry, or its daemon dying), the
final state is stored and nothing of it remains on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ringfence.audit.chain import SYSTEM
from ringfence.backends import LaunchSpec, LiveSandbox, SandboxRuntime
from ringfence.config import Config
from ringfence.errors import (
    ExecutionNotFound,
    InvalidRequest,
    RingfenceError,
    SandboxElsewhere,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    ServerAtCapacity,
    TooManyRequests,
)
from ringfence.models import (
    ExecutionResult,
    NetworkMode,
    NetworkPolicy,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
    SandboxState,
    Status,
)
from ringfence.network.session import Asker, Requester, SessionLookup, requesting
from ringfence.policy.limits import check_limits, check_timeout
from ringfence.policy.network import check_tenant_policy, policy_for
from ringfence.service.audit import AuditLog
from ringfence.service.budget import Amount, Budget, Reservation
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.pool import PoolStats, Warm, WarmPool
from ringfence.service.sandbox_calls import SandboxCalls
from ringfence.store import Store
from ringfence.templates import DAEMON_PYTHON, TemplateNotFound, has_program
from ringfence.templates import resolve as resolve_template

__all__ = ["RESTART_ERROR", "SANDBOX_ID_VARIABLE", "SandboxService", "template_image"]

log = logging.getLogger(__name__)

# Set in every sandbox: commands may want to know where they run.
SANDBOX_ID_VARIABLE = "RINGFENCE_SANDBOX_ID"
RESTART_ERROR = "the server stopped while this sandbox ran; the sandbox was killed with it"
# Without a built template of that name, "base" is the host's system directories.
_BUILTIN_TEMPLATE = "base"
_DAEMON_START_SECONDS = 10.0


@dataclass
class _Live:
    """One sandbox this process runs (an entry of the live table, by sandbox id)."""

    tenant: str
    live: LiveSandbox  # the runtime's handle; the record (``Sandbox``) is in the store
    daemon: DaemonClient
    ended: asyncio.Future[Sandbox]
    failure: str | None = None  # why it is being killed, when that is a failure
    ending: bool = False  # the watcher is storing its end
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one store write at a time
    # A pooled sandbox's record, still being written after its claim was answered.
    recorded: asyncio.Task[None] | None = None
    # What it holds of its tenant's budget and the server's: given back when its end is stored.
    reservations: list[Reservation] = field(default_factory=list)

    async def record_written(self) -> None:
        """Wait until the sandbox's record is written (or failed to be: the store says)."""
        if self.recorded is not None:
            await asyncio.wait({self.recorded})


class SandboxService:
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
    ) -> None:
        """``runtime`` None: this server's backend cannot run interactive sandboxes.
        ``audit`` None: nothing is recorded. ``pool``: ready sandboxes to claim.
        ``budget``: what tenants and the server may hold; the server's execution service
        must be given the same one, or sandboxes and executions are not counted together
        (so there is no default). ``egress_asker``: who is asked about "ask" egress rules
        (None: they are denied). ``egress_gateway``: where a running sandbox's egress
        session is found to change its policy (None: ``set_network`` changes none live)."""
        self._store = store
        self._runtime = runtime
        self._config = config
        self._audit = audit
        self._pool = pool
        self._budget = budget
        self._live: dict[str, _Live] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        self.calls = SandboxCalls(self)  # commands, files and code, passed to the daemons
        self._egress_asker = egress_asker
        self._egress_gateway = egress_gateway

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
        return len(self._live)

    async def reconcile(self) -> int:
        """After a restart: sandboxes recorded as running died with the server that ran
        them (``--die-with-parent``; the runtime sweeps what they left). Returns how many
        were marked failed."""
        ended = await self._store.end_running_sandboxes(RESTART_ERROR)
        for tenant, sandbox in ended:
            log.warning("sandbox %s/%s was cut off by a restart", tenant, sandbox.id)
        return len(ended)

    def check_policy(self, spec: SandboxSpec) -> str:
        """The root filesystem of the spec's template, if the spec is allowed here.

        Raises:
            InvalidRequest: no such template, limits or timeout above the ceilings, or a
                network policy that reaches internal networks the operator did not allow.
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
        check_tenant_policy(spec.network, self._config)
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
        """
        amount = self._budget.amount(spec.limits.merged_over(self._config.default_limits))
        # The tenant's share now; the host's once it is known whether the pool serves it
        # (a pooled sandbox holds its own). Handed to its live entry (emptied here) once it
        # runs, and given back by the watcher at its end.
        held = [self._budget.reserve(tenant, amount, on_host=False)]
        try:
            return await self._create(tenant, spec, actor, held)
        finally:
            for reservation in held:
                self._budget.release(reservation)

    async def _create(
        self, tenant: str, spec: SandboxSpec, actor: str, held: list[Reservation]
    ) -> Sandbox:
        image = self.check_policy(spec)
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
            limits=spec.limits.merged_over(self._config.default_limits),
            network=network.redacted(),  # header values (credentials) are never stored
            created_at=now,
            expires_at=now + timedelta(seconds=timeout),
        )
        if self._pool is not None:
            if spec.limits == SandboxLimits() and network.mode is NetworkMode.NONE:
                warm = self._pool.claim(spec.template)
                if warm is not None:
                    if warm.reservation is not None:
                        held.append(warm.reservation)
                    return await self._bind(warm, tenant, sandbox, spec, timeout, actor, held)
            else:
                self._pool.pass_over(spec.template)
        held.append(await self._reserve_host(self._budget.amount(sandbox.limits)))
        launch = LaunchSpec(
            image=image,
            env={**spec.env, SANDBOX_ID_VARIABLE: sandbox.id},
            limits=sandbox.limits,
            timeout=timeout,
            network=network,
        )
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
        }
        requester = Requester(
            tenant, f"sandbox:{sandbox.id}", actor, self._audit, self._egress_asker
        )
        try:
            with requesting(requester):  # whose egress the proxy audits and asks about
                live = await self._runtime.start(launch)
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
        daemon = DaemonClient(sandbox.id, live.socket_path)
        entry = _Live(tenant, live, daemon, asyncio.get_running_loop().create_future())
        entry.reservations, held[:] = held[:], []  # released by the watcher, at its end
        self._live[sandbox.id] = entry
        watcher = asyncio.create_task(self._watch(sandbox, entry))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        try:
            await recorded
            await daemon.health(_DAEMON_START_SECONDS)
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
        return sandbox

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
        timeout: float,
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
        entry = _Live(tenant, warm.live, warm.daemon, asyncio.get_running_loop().create_future())
        entry.reservations, held[:] = held[:], []  # released by the watcher, at its end
        entry.recorded = asyncio.create_task(self._store.add_sandbox(tenant, sandbox))
        initialized = warm.daemon.start_init({**spec.env, SANDBOX_ID_VARIABLE: sandbox.id})
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
            await warm.live.set_timeout(timeout)
        except BaseException as exc:
            entry.failure = entry.failure or f"its claim from the pool failed: {exc}"
            await asyncio.shield(warm.live.kill())
            raise
        for step in (entry.recorded, initialized):  # failed already: it is being killed
            if (failure := _failure(step)) is not None:
                raise failure
        details = {"template": spec.template, "timeout": timeout, "pooled": True,
                   "env": sorted(spec.env), "metadata": spec.metadata}  # fmt: skip
        self.record(tenant, actor, "sandbox.create", sandbox.id, "ok", details)
        return sandbox

    def _kill_on_failure(self, entry: _Live, step: asyncio.Task[None], *, what: str) -> None:
        """Kill a claimed sandbox whose ``what`` (a step finished after the claim) failed."""
        failure = _failure(step)
        if failure is None:
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
            SandboxNotRunning: it has ended.
            InvalidRequest: the timeout is above the operator's ceiling.
        """
        check_timeout(timeout, self._config)
        entry = await self._running(tenant, sandbox_id)
        async with entry.writing:  # the end, stored by the watcher, is never overwritten
            if entry.ending:
                raise SandboxNotRunning(f"sandbox {sandbox_id} is ending")
            sandbox = await self.get(tenant, sandbox_id)
            try:
                await entry.live.set_timeout(timeout)
            except ExecutionNotFound:  # its run ended (and was forgotten) just now
                raise SandboxNotRunning(f"sandbox {sandbox_id} has ended") from None
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
        check_tenant_policy(policy, self._config)
        policy = policy_for(tenant, policy, self._config)  # under the operator's floor
        entry = await self._running(tenant, sandbox_id)
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
        if self._audit is not None:
            await self._audit.record_now(
                tenant, actor, "sandbox.network", f"sandbox:{sandbox_id}",
                details={"network": changed.network.model_dump(mode="json")},
            )  # fmt: skip
        return changed

    async def kill(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> Sandbox:
        """Kill every process of the sandbox and remove everything of it; an ended sandbox
        is returned unchanged.

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
        """
        entry = self._live.get(sandbox_id)
        if entry is None or entry.tenant != tenant:
            return _ended_here(await self.get(tenant, sandbox_id))
        self.record(tenant, actor, "sandbox.kill", sandbox_id)
        await entry.live.kill()
        return await asyncio.shield(entry.ended)

    async def daemon(self, tenant: str, sandbox_id: str) -> DaemonClient:
        """The client of a running sandbox's daemon.

        Raises:
            SandboxNotFound: no such sandbox in this tenant.
            SandboxNotRunning: it has ended.
        """
        return (await self._running(tenant, sandbox_id)).daemon

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
        if self._pool is not None:
            await self._pool.aclose()
        entries = list(self._live.values())
        await asyncio.gather(*(e.live.kill() for e in entries), return_exceptions=True)
        await asyncio.gather(*self._watchers, return_exceptions=True)
        if self._runtime is not None:
            await self._runtime.aclose()

    async def _running(self, tenant: str, sandbox_id: str) -> _Live:
        entry = self._live.get(sandbox_id)
        if entry is not None and entry.tenant == tenant and not entry.ended.done():
            return entry
        sandbox = _ended_here(await self.get(tenant, sandbox_id))  # SandboxNotFound, too
        raise SandboxNotRunning(f"sandbox {sandbox_id} has ended ({sandbox.state.value})")

    async def _watch(self, sandbox: Sandbox, entry: _Live) -> None:
        """Wait for the end; store it; release the daemon client."""
        ended = sandbox.ended(SandboxState.FAILED, "internal error")
        try:
            result = await entry.live.ended()
            state, error = _ending(result)
            if entry.failure is not None:
                state, error = SandboxState.FAILED, entry.failure
            await entry.record_written()
            async with entry.writing:
                entry.ending = True
                current = await self._store.get_sandbox(entry.tenant, sandbox.id) or sandbox
                ended = current.ended(state, error)
                self.record(
                    entry.tenant, SYSTEM, "sandbox.end", sandbox.id, state.value, {"error": error}
                )
                await self._store.update_sandbox(entry.tenant, ended)
        except Exception:  # boundary: whatever happens, the sandbox must end here
            log.exception("could not store the end of sandbox %s/%s", entry.tenant, sandbox.id)
        finally:
            del self._live[sandbox.id]
            for reservation in entry.reservations:
                self._budget.release(reservation)
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


def _ended_here(sandbox: Sandbox) -> Sandbox:
    """``sandbox`` (not live in this process), unless the store says it runs: then another
    replica runs it (a restart marks this process's own as failed before it serves).

    Raises:
        SandboxElsewhere: it runs on another replica.
    """
    if sandbox.state is SandboxState.RUNNING:
        raise SandboxElsewhere(
            f"sandbox {sandbox.id} runs on another Ringfence replica, which alone can reach "
            "it: send its requests there (route by sandbox id)"
        )
    return sandbox


def _failure(step: asyncio.Task[None]) -> BaseException | None:
    """Why ``step`` failed, if it has (a cancelled step is no failure)."""
    if not step.done() or step.cancelled():
        return None
    return step.exception()


async def _kill(live: LiveSandbox) -> None:
    await live.kill()


def _new_id() -> str:
    return "sb" + secrets.token_hex(10)
