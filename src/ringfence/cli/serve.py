"""``ringfence serve``: the control plane, on loopback by default."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import Any

import click

from ringfence.cli._common import fail, settings
from ringfence.config import Config
from ringfence.errors import BackendUnavailable, InvalidRequest, RingfenceError, UnknownBackend

__all__ = ["serve"]

EXIT_UNAVAILABLE = 125
_EXECUTOR_RETENTION = 256


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="Database and first admin key [default: $RINGFENCE_DATA_DIR, /var/lib/ringfence as root].",
)
@click.option("--database-url", help="e.g. postgresql+psycopg://user@host/db [default: SQLite].")
def serve(host: str, port: int, data_dir: Path | None, database_url: str | None) -> None:
    """Serve the Ringfence API (OpenAPI at /docs).

    On first start with an empty store it creates an admin key for tenant 'default' and
    writes it to <data dir>/admin-key (readable by you only).
    """
    config = settings(data_dir=data_dir, database_url=database_url)
    try:
        asyncio.run(_serve(config, host, port))
    except UnknownBackend as exc:
        raise click.UsageError(exc.message) from None
    except (BackendUnavailable, RingfenceError) as exc:
        fail(exc.message, EXIT_UNAVAILABLE)
    except OSError as exc:
        fail(f"cannot start: {exc}", EXIT_UNAVAILABLE)
    except KeyboardInterrupt:
        pass


_KEEP_ALIVE_SECONDS = 330


async def _serve(config: Config, host: str, port: int) -> None:
    import uvicorn

    from ringfence.audit.signing import SealKey
    from ringfence.backends import create_executor, create_sandbox_runtime
    from ringfence.server import create_app
    from ringfence.service.approvals import ApprovalService
    from ringfence.service.audit import AuditLog
    from ringfence.service.egress_asks import EgressAsks
    from ringfence.service.executions import ExecutionService
    from ringfence.service.keys import FIRST_TENANT, bootstrap_admin_key
    from ringfence.service.pool import WarmPool
    from ringfence.service.sandboxes import SandboxService, template_image
    from ringfence.service.webhooks import WebhookNotifier
    from ringfence.store.factory import open_store

    # The store keeps every result; the executor need only hold runs until they are stored.
    retention = {"max_retained_results": min(config.max_retained_results, _EXECUTOR_RETENTION)}
    executor = create_executor(config.model_copy(update=retention))  # fails closed
    store = await open_store(config)
    created = await bootstrap_admin_key(store, config.data_dir)
    if created is not None:
        click.echo(
            f"ringfence: first start: an admin key for tenant {FIRST_TENANT!r} is in {created}",
            err=True,
        )
    audit = AuditLog(store, SealKey.load_or_create(config.data_dir))
    await audit.check_key()  # fails closed: a log no export of which could verify
    service = ExecutionService(store, executor, config, audit)
    runtime = create_sandbox_runtime(executor, config)
    pool = None
    if runtime is not None and any(config.pool_sizes.values()):
        pool = WarmPool(
            runtime, config, config.pool_sizes, lambda name: template_image(name, config)
        )
    if executor.name == "job":  # its egress proxy, on the replica's Pod IP when given
        from ringfence.backends.kubernetes.replica_egress import start_replica_egress

        await start_replica_egress(config, executor, runtime)
    sandboxes = SandboxService(store, runtime, config, audit, pool)
    sandboxes.egress_gateway = getattr(executor, "egress", None)  # live policy changes
    notifier = None
    if config.webhook_urls:
        if not config.webhook_secret:
            raise InvalidRequest(
                "RINGFENCE_WEBHOOK_URLS is set without RINGFENCE_WEBHOOK_SECRET: webhook "
                "deliveries are always signed"
            )
        notifier = WebhookNotifier(config.webhook_urls, config.webhook_secret)
    approvals = ApprovalService(store, service, audit, config, notifier)
    asks = EgressAsks(audit, config, notifier)  # "ask" egress rules wait for a human here
    sandboxes.egress_asker = service.egress_asker = asks
    app = create_app(
        store=store, executions=service, sandboxes=sandboxes, audit=audit,
        approvals=approvals, owns_store=True,
        max_request_bytes=config.max_request_bytes,
    )  # fmt: skip
    # E2B's SDKs keep idle connections for 300 s; a server that closes them sooner races
    # their next request (a reset connection, seen about once in ten 32-sandbox runs).
    config_ = uvicorn.Config(
        app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5,
        timeout_keep_alive=_KEEP_ALIVE_SECONDS,
    )  # fmt: skip

    async def on_exit() -> None:
        await sandboxes.aclose()
        await service.aclose()

    try:
        await _server_class()(config_, on_exit=on_exit).serve()
    finally:
        if notifier is not None:
            await notifier.aclose()


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """On SIGTERM or Ctrl-C, cancel running executions first: clients waiting on one get
        its (cancelled) result instead of a connection cut at the graceful-shutdown deadline."""

        def __init__(
            self, config: uvicorn.Config, on_exit: Callable[[], Coroutine[Any, Any, None]]
        ) -> None:
            super().__init__(config)
            self._on_exit = on_exit
            self._cancelling: asyncio.Task[None] | None = None

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            if self._cancelling is None:
                self._cancelling = asyncio.get_running_loop().create_task(self._on_exit())

    return Server
