from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.config import Config
from ringfence.server import create_app
from ringfence.service.executions import ExecutionService
from ringfence.service.keys import mint_key
from ringfence.service.sandboxes import SandboxService
from ringfence.store import MemoryStore, Role, Store
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
async def api(local_host: object, store: Store) -> AsyncIterator[Api]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    executor = LocalExecutor(Config(), host=local_host)
    sandboxes = SandboxService(store, LocalSandboxRuntime(executor, Config()), Config())
    app = create_app(
        store=store,
        executions=ExecutionService(store, executor, Config()),
        sandboxes=sandboxes,
    )
    acme = await mint_key(store, "acme", Role.AGENT)
    globex = await mint_key(store, "globex", Role.AGENT)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url="http://ringfence.test", timeout=30
        ) as client,
    ):
        yield Api(
            client,
            store,
            {"Authorization": f"Bearer {acme}"},
            {"X-API-Key": globex},
            transport,
            acme,
            globex,
        )
