"""A template's own default limits at every door (on the fakes: the limits are the
service's answer, the real sandboxes' are tests/server/test_pool_templates.py's): a create
of ``Config.browser_template`` that leaves memory and pids out gets ``browser_memory`` and
``browser_pids``, through the native API (which the SDK, the CLI and the MCP tools call)
and the E2B door; another template keeps the general defaults."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from ringfence.audit.signing import SealKey
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import Role
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store import MemoryStore
from ringfence.testing.fakes import FakeExecutor, FakeSandboxRuntime

pytestmark = pytest.mark.fakes


@contextlib.asynccontextmanager
async def _serving(config: Config) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    store = MemoryStore()
    services = await build_services(
        config, store=store, executor=FakeExecutor(config), runtime=FakeSandboxRuntime(config),
        seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    key = await mint_key(store, "acme", Role.AGENT)
    transport = httpx.ASGITransport(app=app)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(services.aclose)
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = httpx.AsyncClient(transport=transport, base_url="http://rf.test", timeout=30)
        yield await stack.enter_async_context(client), key


@pytest.fixture
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, str, Config]]:
    data_dir = Path(tempfile.mkdtemp(prefix="rf-data-"))
    # "base" is the browser template here: the rule is by name.
    config = Config(
        pool_sizes={}, data_dir=data_dir, browser_template="base", browser_memory=768 << 20,
        browser_pids=600,
    )  # fmt: skip
    try:
        async with _serving(config) as (client, key):
            yield client, key, config
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_the_native_door_gives_the_browser_template_its_limits(
    served: tuple[httpx.AsyncClient, str, Config],
) -> None:
    client, key, config = served
    headers = {"Authorization": f"Bearer {key}"}
    created = await client.post("/v1/sandboxes", headers=headers, json={"template": "base"})
    assert created.status_code == 201, created.text
    limits = created.json()["limits"]
    assert (limits["memory"], limits["pids"]) == (768 << 20, 600)
    assert limits["cpus"] == config.default_limits.cpus
    asked = await client.post(
        "/v1/sandboxes", headers=headers, json={"template": "base", "limits": {"pids": 700}}
    )
    assert asked.status_code == 201, asked.text
    assert (asked.json()["limits"]["pids"], asked.json()["limits"]["memory"]) == (700, 768 << 20)


async def test_the_e2b_door_gives_the_browser_template_its_limits(
    served: tuple[httpx.AsyncClient, str, Config],
) -> None:
    client, key, _ = served
    created = await client.post(
        "/v2/sandboxes", headers={"X-API-KEY": key}, json={"templateID": "base"}
    )
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["sandboxID"]
    detail = await client.get(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": key})
    assert detail.status_code == 200, detail.text
    assert detail.json()["memoryMB"] == 768


async def test_other_templates_keep_the_general_defaults() -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="rf-data-"))
    config = Config(pool_sizes={}, data_dir=data_dir)  # browser_template: "browser"
    try:
        async with _serving(config) as (client, key):
            headers = {"Authorization": f"Bearer {key}"}
            created = await client.post("/v1/sandboxes", headers=headers, json={})
            assert created.status_code == 201, created.text
            limits = created.json()["limits"]
            assert limits["memory"] == config.default_limits.memory
            assert limits["pids"] == config.default_limits.pids
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_the_browser_templates_defaults_never_pass_the_servers_ceilings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Review 3 #8: with max_limits below browser_memory and browser_pids, a create of the
    browser template that leaves them out got 1.5 GiB and 1024 pids anyway. They are
    clamped to the ceilings, and the server's startup log says so."""
    data_dir = Path(tempfile.mkdtemp(prefix="rf-data-"))
    config = Config(
        pool_sizes={}, data_dir=data_dir, browser_template="base",
        max_limits={"memory": 1 << 30, "pids": 600, "cpus": 1.0, "disk": 1 << 30},
    )  # fmt: skip
    try:
        with caplog.at_level("WARNING", logger="ringfence.compose"):
            async with _serving(config) as (client, key):
                headers = {"Authorization": f"Bearer {key}"}
                created = await client.post(
                    "/v1/sandboxes", headers=headers, json={"template": "base"}
                )
                assert created.status_code == 201, created.text
                limits = created.json()["limits"]
                assert (limits["memory"], limits["pids"]) == (1 << 30, 600)
                e2b = await client.post(
                    "/v2/sandboxes", headers={"X-API-KEY": key}, json={"templateID": "base"}
                )
                assert e2b.status_code == 201, e2b.text
                detail = await client.get(
                    f"/sandboxes/{e2b.json()['sandboxID']}", headers={"X-API-KEY": key}
                )
                assert detail.json()["memoryMB"] == 1024, detail.text
                (said,) = [r.getMessage() for r in caplog.records if "clamped" in r.getMessage()]
        assert "browser_memory 1610612736 to max_limits.memory 1073741824" in said
        assert "browser_pids 1024 to max_limits.pids 600" in said
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
