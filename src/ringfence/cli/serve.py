"""``ringfence serve``: the control plane, on loopback by default."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from ringfence.cli._common import fail, settings
from ringfence.config import Config
from ringfence.errors import BackendUnavailable, RingfenceError, UnknownBackend

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


async def _serve(config: Config, host: str, port: int) -> None:
    import uvicorn

    from ringfence.backends import create_executor
    from ringfence.server import create_app
    from ringfence.service.executions import ExecutionService
    from ringfence.service.keys import FIRST_TENANT, bootstrap_admin_key
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
    service = ExecutionService(store, executor, config)
    app = create_app(
        store=store, executions=service, owns_store=True,
        max_request_bytes=config.max_request_bytes,
    )  # fmt: skip
    # On SIGTERM, connections waiting for an execution get this long before shutdown
    # cancels the executions (their results are stored as cancelled).
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
    )
    await server.serve()
