"""The composition root: the one place that builds the server's services from a ``Config``.

``build_services`` opens the store, creates the executor and its sandbox runtime, and hands
each service what it needs through its constructor; ``ringfence serve``, every test fixture
that serves the API, and ``server.create_app`` (which takes the result) all go through it.
It is the only module that imports the service layer, the backends and the store together.

``open_offline`` is the same for the operator's commands that run with no server (``ringfence
keys``, ``ringfence audit export`` and ``tail``): the store of a ``Config``, behind the
services those commands use.

What a test replaces comes in as a keyword (``store=``, ``executor=``, ``seal_key=``...);
what is given stays its caller's: ``Services.aclose`` closes only what the root opened.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, Literal

from ringfence.audit.signing import SealKey
from ringfence.backends import Executor, SandboxRuntime, create_executor, create_sandbox_runtime
from ringfence.config import Config
from ringfence.errors import InvalidRequest, RingfenceError
from ringfence.network.gateway import EgressGateway
from ringfence.policy.limits import clamped_browser_defaults, template_limits
from ringfence.service.approvals import ApprovalService
from ringfence.service.audit import AuditLog, AuditRecords
from ringfence.service.browser import BrowserService
from ringfence.service.browser_agent import BrowserAgent
from ringfence.service.budget import Budget
from ringfence.service.credentials import CredentialKey
from ringfence.service.egress_asks import EgressAsks
from ringfence.service.executions import ExecutionService
from ringfence.service.keys import Keys
from ringfence.service.pool import WarmPool
from ringfence.service.sandboxes import SandboxService, template_image
from ringfence.service.volumes import VolumeService
from ringfence.service.webhooks import WebhookNotifier
from ringfence.store import Store

if TYPE_CHECKING:
    from ringfence.backends.kubernetes.replica_egress import ReplicaEgress

__all__ = ["BUILD", "Offline", "Services", "build_services", "open_offline", "start_job_egress"]

# The store keeps every result; the executor need only hold runs until they are stored.
_EXECUTOR_RETENTION = 256
_SEAL_INTERVAL_SECONDS = 60.0
EXPORT_KEY_PURPOSE = "sandbox exports"  # what the runtime's export key is derived for


class _Build(Enum):
    BUILD = "build"


BUILD: Final = _Build.BUILD
"""For ``runtime=``: not given, build the executor's own (None is "no runtime")."""

_Closer = Callable[[], Awaitable[None]]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Services:
    """Everything the API serves with, wired. The app's lifespan starts and stops the
    services (approvals, sandboxes, executions with their executor and runtime, the audit
    log); ``aclose`` then closes what the root opened for them (the store and the webhook
    notifier, unless they were given). Usable as ``async with``."""

    config: Config
    store: Store
    executor: Executor
    runtime: SandboxRuntime | None  # None: this backend runs no interactive sandboxes
    audit: AuditLog
    keys: Keys  # the doors check keys through it (one cache per replica)
    budget: Budget  # one for both: sandboxes and executions count together
    executions: ExecutionService
    pool: WarmPool | None
    sandboxes: SandboxService
    browser: BrowserService  # scrapes in sandboxes' browsers, one-shot scrapes
    volumes: VolumeService  # tenants' volumes (refusing every call where there are none)
    approvals: ApprovalService
    asks: EgressAsks  # "ask" egress rules wait for a human here
    notifier: WebhookNotifier | None
    credentials: CredentialKey
    _owned: tuple[_Closer, ...] = field(default=(), repr=False, compare=False)

    async def aclose(self) -> None:
        """Close what ``build_services`` opened (last opened, first closed)."""
        await _close(self._owned)

    async def __aenter__(self) -> Services:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        await self.aclose()
        return False


async def build_services(
    config: Config,
    *,
    store: Store | None = None,
    executor: Executor | None = None,
    runtime: SandboxRuntime | _Build | None = BUILD,
    seal_key: SealKey | None = None,
    seal_interval: float = _SEAL_INTERVAL_SECONDS,
    credentials: CredentialKey | None = None,
    notifier: WebhookNotifier | None = None,
    on_first_admin_key: Callable[[Path], None] | None = None,
) -> Services:
    """The services of a server with ``config``, in the order ``ringfence serve`` has always
    started them (each check fails the start before the next part touches anything).

    Not given, each part is made from ``config``: the executor from ``config.backend`` (it
    fails closed first, before the store is opened), the store from ``database_url``, the
    audit log's seal key and the credentials key from ``data_dir`` (the sandbox runtime's
    key that seals exported sandbox state is derived from the latter), the notifier from
    ``webhook_urls``. ``on_first_admin_key`` given (``ringfence serve``): on a store without
    keys, the first admin key is written to ``<data_dir>/admin-key`` and its path told to it.

    Raises:
        UnknownBackend, BackendUnavailable: the backend is unknown, or the host lacks it.
        StoreError: the store cannot be opened, or the audit log was sealed by another key.
        InvalidRequest: webhook URLs without a secret; TLS interception on the job backend.
        RingfenceError: the credentials key file is unusable (the message says why).
        OSError: a directory or a file cannot be prepared, or an address cannot be bound.
    """
    owned: list[_Closer] = []  # closed by ``Services.aclose``
    built: list[_Closer] = []  # the rest the root made, closed here if the build fails
    try:
        return await _build(
            config, owned, built, store=store, executor=executor, runtime=runtime,
            seal_key=seal_key, seal_interval=seal_interval, credentials=credentials,
            notifier=notifier, on_first_admin_key=on_first_admin_key,
        )  # fmt: skip
    except BaseException:
        await _close_quietly((*built, *owned))
        raise  # the build's own error (its fail-closed refusal), never a cleanup's


async def _build(
    config: Config,
    owned: list[_Closer],
    built: list[_Closer],
    *,
    store: Store | None,
    executor: Executor | None,
    runtime: SandboxRuntime | _Build | None,
    seal_key: SealKey | None,
    seal_interval: float,
    credentials: CredentialKey | None,
    notifier: WebhookNotifier | None,
    on_first_admin_key: Callable[[Path], None] | None,
) -> Services:
    if executor is None:
        retention = min(config.max_retained_results, _EXECUTOR_RETENTION)
        executor = create_executor(config.model_copy(update={"max_retained_results": retention}))
        built.append(executor.aclose)  # after a good build, the app's lifespan closes it
    if store is None:
        from ringfence.store.factory import open_store

        store = await open_store(config)
        owned.append(store.aclose)
    keys = Keys(store)
    if on_first_admin_key is not None:
        created = await keys.bootstrap_admin(config.data_dir)
        if created is not None:
            on_first_admin_key(created)
    audit = AuditLog(store, seal_key or SealKey.load_or_create(config.data_dir), seal_interval)
    await audit.check_key()  # fails closed: a log no export of which could verify
    budget = Budget.for_server(config)
    if credentials is None:
        try:
            credentials = CredentialKey.load_or_create(config.data_dir)
        except ValueError as exc:
            raise RingfenceError(str(exc)) from None
    if isinstance(runtime, _Build):
        # Exports (paused sandboxes, snapshots, forks) are sealed under a key derived from
        # the credentials key: it lives in the data directory with them, outside the database,
        # and replicas that share one share the other.
        export_key = credentials.derive(EXPORT_KEY_PURPOSE)
        runtime = create_sandbox_runtime(executor, config, export_key=export_key)
    if (clamped := clamped_browser_defaults(config)) is not None:
        log.warning("%s", clamped)
    browser_agent = BrowserAgent(config.max_browser_result_bytes, config.max_browser_buffered_bytes)
    pool = None
    if runtime is not None and any(config.pool_sizes.values()):
        pool = WarmPool(
            runtime, config, config.pool_sizes, lambda name: template_image(name, config), budget,
            # A create with default limits claims the template's pooled sandbox: both take
            # the template's own defaults (the browser's memory and pids).
            limits_for=lambda name: template_limits(name, config),
            # A pooled browser sandbox joins with its agent and Chromium running.
            prepare={config.browser_template: browser_agent.prepare},
            # Its pooled sandboxes start deny-all, so a one-shot scrape (the tenant's egress
            # policy) can claim one: only where the egress gateway is this process's own.
            networked=(
                [config.browser_template]
                if isinstance(getattr(executor, "egress", None), EgressGateway) else []
            ),
        )  # fmt: skip
    if executor.name == "job":  # its egress proxy, on the replica's Pod IP when given
        await start_job_egress(config, executor, runtime)
    if notifier is None and config.webhook_urls:
        if not config.webhook_secret:
            raise InvalidRequest(
                "RINGFENCE_WEBHOOK_URLS is set without RINGFENCE_WEBHOOK_SECRET: webhook "
                "deliveries are always signed"
            )
        notifier = WebhookNotifier(config.webhook_urls, config.webhook_secret)
        owned.append(notifier.aclose)
    volumes = _volumes(config, store, executor, audit, owned)
    asks = EgressAsks(audit, config, notifier)
    executions = ExecutionService(store, executor, config, audit, budget=budget, egress_asker=asks)
    sandboxes = SandboxService(
        store, runtime, config, audit, pool, budget=budget, egress_asker=asks,
        # Where a running sandbox's policy changes live: the executor's egress, if it has one.
        egress_gateway=getattr(executor, "egress", None), credentials=credentials,
        volumes=volumes,
    )  # fmt: skip
    approvals = ApprovalService(store, executions, audit, config, notifier, credentials=credentials)
    browser = BrowserService(sandboxes, config, browser_agent)
    return Services(
        config=config, store=store, executor=executor, runtime=runtime, audit=audit,
        keys=keys, budget=budget, executions=executions, pool=pool, sandboxes=sandboxes,
        browser=browser, volumes=volumes, approvals=approvals, asks=asks, notifier=notifier,
        credentials=credentials, _owned=tuple(owned),
    )  # fmt: skip


def _volumes(
    config: Config, store: Store, executor: Executor, audit: AuditLog, owned: list[_Closer]
) -> VolumeService:
    """Tenants' volumes, on this host's disk where it can keep them (root, and a backend
    whose sandboxes run here: not the job backend's Pods); else a service that refuses
    every call saying why."""
    if executor.name == "job":
        missing = "sandbox Pods cannot mount volumes yet (use the local backend)"
        return VolumeService(store, None, config, audit, missing=missing)
    from ringfence.backends.local.disks import VolumeDisks

    try:
        disks = VolumeDisks.open(config.data_dir)
    except RingfenceError as exc:
        log.info("no volumes on this server: %s", exc.message)
        return VolumeService(store, None, config, audit, missing=exc.message)

    async def close() -> None:
        disks.close()

    owned.append(close)
    return VolumeService(store, disks, config, audit)


@dataclass(frozen=True)
class Offline:
    """What the operator's offline commands work with, over one open store."""

    keys: Keys
    audit: AuditRecords


@contextlib.asynccontextmanager
async def open_offline(config: Config) -> AsyncIterator[Offline]:
    """Open ``config``'s store (``database_url``, else SQLite in ``data_dir``) for the
    operator's commands, and close it when they are done.

    Raises:
        StoreError: the store cannot be opened.
    """
    from ringfence.store.factory import open_store

    store = await open_store(config)
    try:
        yield Offline(keys=Keys(store), audit=AuditRecords(store))
    finally:
        await store.aclose()


async def start_job_egress(
    config: Config, executor: Executor, runtime: SandboxRuntime | None
) -> ReplicaEgress | None:
    """Start the job backend's egress proxy on the replica's Pod IP and hand it to
    ``executor`` (which closes it) and ``runtime``; None without a Pod IP (egress rules
    then stay refused: fail closed).

    Raises:
        InvalidRequest: TLS interception is configured (no CA reaches sandbox Pods).
        OSError: it cannot listen there, or a reserved Service does not resolve.
    """
    from ringfence.backends.kubernetes.backend import JobExecutor
    from ringfence.backends.kubernetes.interactive import PodSandboxRuntime
    from ringfence.backends.kubernetes.replica_egress import start_replica_egress

    if not isinstance(executor, JobExecutor):
        raise TypeError(f"the replica's egress is the job backend's, not {executor.name!r}'s")
    if runtime is not None and not isinstance(runtime, PodSandboxRuntime):
        raise TypeError("the replica's egress is for the job backend's Pod runtime")
    egress = await start_replica_egress(config)
    if egress is not None:
        executor.use_egress(egress)
        if runtime is not None:
            runtime.use_egress(egress)
    return egress


async def _close(closers: tuple[_Closer, ...]) -> None:
    async with contextlib.AsyncExitStack() as stack:
        for close in closers:
            stack.push_async_callback(close)


async def _close_quietly(closers: tuple[_Closer, ...]) -> None:
    """Close each of ``closers`` (last opened, first closed) after a failed build: one that
    raises is logged and the rest still run, so the error that failed the build is the one
    ``serve`` reports (and maps to its exit code)."""
    for close in reversed(closers):
        try:
            await close()
        except Exception:
            log.exception("closing a part of a failed build failed (the build's error follows)")
