from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ringfence.audit.signing import SealKey
from ringfence.backends.local import LocalExecutor
from ringfence.compose import Services, build_services
from ringfence.config import Config
from ringfence.models import Role
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store import MemoryStore, Store
from ringfence.testing.fakes import FakeExecutor, FakeSandboxRuntime
from tests.conftest import EVERY_STORE, FAKES
from tests.store.conftest import postgres_database, sqlite_database

__all__ = ["Api", "postgres_database", "sqlite_database"]


@dataclass
class Api:
    """An in-process server with two tenants' keys."""

    client: httpx.AsyncClient
    store: Store
    acme: dict[str, str]  # headers with tenant acme's agent key
    globex: dict[str, str]  # headers with tenant globex's agent key
    transport: httpx.ASGITransport
    acme_key: str
    globex_key: str
    services: Services


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """Each store in turn, fresh: in memory, SQLite in a file, a new PostgreSQL database."""
    if request.param == "memory":
        yield MemoryStore()
        return
    from ringfence.store.sql import SqlStore

    url: str = request.getfixturevalue(f"{request.param}_database")
    store = await SqlStore.open(url)
    yield store
    await store.aclose()


@pytest.fixture
async def api(request: pytest.FixtureRequest, store: Store) -> AsyncIterator[Api]:
    """The app in process on ``store``, on real sandboxes (``LocalExecutor``,
    ``LocalSandboxRuntime``), or on the fakes for a test marked ``fakes`` that is not one of
    the end-to-end set (marked ``every_store``: that set keeps the real parts)."""
    async with _serving(_local_host_unless_on_fakes(request), store) as api:
        yield api


@pytest.fixture(params=["sqlite", "postgres"])
async def live(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    """``api`` on SQLite or PostgreSQL, served over real HTTP on loopback: sandbox traffic
    streams, which the in-process transport (it buffers whole answers) cannot show. On the
    fakes as ``api`` is."""
    from ringfence.store.sql import SqlStore

    local_host = _local_host_unless_on_fakes(request)
    store = await SqlStore.open(request.getfixturevalue(f"{request.param}_database"))
    try:
        async with _serving(local_host, store, over_http=True) as api:
            yield api
    finally:
        await store.aclose()


def _local_host_unless_on_fakes(request: pytest.FixtureRequest) -> object | None:
    """The local backend's host for a test on real sandboxes; None for a test on the fakes:
    marked ``fakes`` and not ``every_store`` (the end-to-end set keeps the real parts)."""
    node = request.node
    if node.get_closest_marker(FAKES) and not node.get_closest_marker(EVERY_STORE):
        return None
    host: object = request.getfixturevalue("local_host")
    return host


@contextlib.asynccontextmanager
async def _serving(
    local_host: object | None, store: Store, over_http: bool = False
) -> AsyncIterator[Api]:
    """Serve on ``store`` with the local backend on ``local_host``, or, ``local_host`` None,
    on the fakes (``FakeExecutor``, ``FakeSandboxRuntime``: no isolation, no limits)."""
    from ringfence.backends.local.probe import Host

    # Its own data directory: paused sandboxes and snapshots are kept there.
    data_dir = Path(tempfile.mkdtemp(prefix="rf-data-"))
    config = Config(pool_sizes={}, data_dir=data_dir)
    if local_host is None:
        services = await build_services(
            config, store=store, executor=FakeExecutor(config),
            runtime=FakeSandboxRuntime(config), seal_key=SealKey.generate(),
            seal_interval=3600, credentials=CredentialKey.generate(),
        )  # fmt: skip
    else:
        assert isinstance(local_host, Host)
        services = await build_services(
            config, store=store, executor=LocalExecutor(config, host=local_host),
            seal_key=SealKey.generate(), seal_interval=3600,
            credentials=CredentialKey.generate(),
        )  # fmt: skip
    app = create_app(services)
    acme = await mint_key(store, "acme", Role.AGENT)
    globex = await mint_key(store, "globex", Role.AGENT)
    transport = httpx.ASGITransport(app=app)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, data_dir, ignore_errors=True)
        stack.push_async_callback(services.aclose)  # before: volumes it mounted in data_dir
        await stack.enter_async_context(app.router.lifespan_context(app))
        if over_http:
            url = await stack.enter_async_context(_uvicorn(app))
            client = httpx.AsyncClient(base_url=url, timeout=30)
        else:
            client = httpx.AsyncClient(
                transport=transport, base_url="http://ringfence.test", timeout=30
            )
        await stack.enter_async_context(client)
        yield Api(
            client,
            store,
            {"Authorization": f"Bearer {acme}"},
            {"X-API-Key": globex},
            transport,
            acme,
            globex,
            services,
        )


@contextlib.asynccontextmanager
async def _uvicorn(app: object) -> AsyncIterator[str]:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[_loopback_socket()]))
    try:
        while not server.started:
            assert not task.done(), "uvicorn stopped while starting"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def _loopback_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock
