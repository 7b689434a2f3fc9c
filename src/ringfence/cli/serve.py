"""``ringfence serve``: the control plane, on loopback by default."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import Any

import click

from ringfence.cli._common import fail, settings
from ringfence.config import Config
from ringfence.errors import BackendUnavailable, Conflict, RingfenceError, UnknownBackend

__all__ = ["serve"]

EXIT_UNAVAILABLE = 125
_LOCK_FILE = "serve.lock"


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
    writes it to <data dir>/admin-key (readable by you only). One data directory has one
    server (unless the store is PostgreSQL): a second one exits, changing nothing.
    """
    config = settings(data_dir=data_dir, database_url=database_url)
    try:
        from ringfence.policy.risk import load_risk_policy

        load_risk_policy(config.risk_policy)  # a bad policy: no start, and nothing changed
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

    # Before anything touches the host or the store: a second server on this data directory
    # would take the first's running sandboxes for a crash's remains and mark them failed.
    lock = _hold_data_dir(config)
    listening = _bind(host, port)
    # The API is never a destination of the egress proxy, whatever the rules (a sandbox
    # would act on itself with its creator's key): the backends refuse where it listens.
    address, bound_port = listening.getsockname()[:2]
    shown = f"[{address}]" if ":" in address else address
    own = [*config.network_reserved_endpoints, f"{shown}:{bound_port}"]
    config = config.model_copy(update={"network_reserved_endpoints": own})

    from ringfence.compose import build_services
    from ringfence.server import create_app
    from ringfence.server.connections import protocol_class
    from ringfence.service.keys import FIRST_TENANT

    def first_start(admin_key: Path) -> None:
        click.echo(
            f"ringfence: first start: an admin key for tenant {FIRST_TENANT!r} is in {admin_key}",
            err=True,
        )

    services = await build_services(config, on_first_admin_key=first_start)
    app = create_app(services)
    # E2B's SDKs keep idle connections for 300 s; a server that closes them sooner races
    # their next request (a reset connection, seen about once in ten 32-sandbox runs).
    # Only authenticated connections get that long: server/connections.py bounds the rest.
    protocol = protocol_class(
        head_timeout=config.request_head_timeout,
        per_client=config.max_unauthenticated_connections_per_client,
        in_all=config.max_unauthenticated_connections,
    )
    config_ = uvicorn.Config(
        app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5,
        timeout_keep_alive=_KEEP_ALIVE_SECONDS, http=protocol,
        ws="wsproto",  # preview URLs' WebSockets (server/connections.py: out of its counts)
        ws_max_size=config.max_websocket_message_bytes,  # what the client sends, reassembled
    )  # fmt: skip

    async def on_exit() -> None:
        await services.sandboxes.aclose()
        await services.executions.aclose()

    try:
        await _server_class()(config_, on_exit=on_exit).serve(sockets=[listening])
    finally:
        await services.aclose()
        if lock is not None:
            os.close(lock)


def _hold_data_dir(config: Config) -> int | None:
    """Lock the data directory for this process's life (the descriptor; None with
    PostgreSQL, whose replicas share a store and tell their sandboxes apart by lease).

    Raises:
        Conflict: another ``ringfence serve`` holds it.
    """
    if config.database_url is not None and not config.database_url.startswith("sqlite"):
        return None
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = config.data_dir / _LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise Conflict(
            f"another ringfence serve (pid {holder}) uses the data directory "
            f"{config.data_dir}: one data directory has one server (replicas share a "
            "PostgreSQL store, --database-url)"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now: a taken port fails the start before the store is
    opened or reconciled. Raises ``OSError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: accepted sockets inherit the protocol, and asyncio sets
    # TCP_NODELAY only on sockets that say TCP. Without it an answer's body waited for the
    # client's delayed ACK of its head (40 ms on every keep-alive request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"{host}:{port}: {exc.strerror}") from exc
    return sock


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

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            for sock in sockets or ():  # uvicorn says it only for sockets it binds itself
                address, port = sock.getsockname()[:2]
                shown = f"[{address}]" if sock.family == socket.AF_INET6 else address
                logging.getLogger("uvicorn.error").info(
                    "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", shown, port
                )

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            if self._cancelling is None:
                self._cancelling = asyncio.get_running_loop().create_task(self._on_exit())

    return Server
