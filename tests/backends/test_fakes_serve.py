"""The fakes serve the API as the real backends do for what tests of logic look at: an
execution's status, exit code and logs; a sandbox's commands and files at ``/home/user``."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
from tests.server._envd import run


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    config = Config(pool_sizes={})
    store = MemoryStore()
    services = await build_services(
        config, store=store, executor=FakeExecutor(config), runtime=FakeSandboxRuntime(config),
        seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    headers = {"Authorization": f"Bearer {await mint_key(store, 'acme', Role.AGENT)}"}
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://ringfence.test") as http,
    ):
        yield http, headers


async def test_an_execution_on_the_fake_executor(
    client: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    http, headers = client
    body = {"id": "hello", "command": ["sh", "-c", "echo hi; exit 3"]}
    answer = (await http.post("/v1/executions", headers=headers, json=body)).json()
    assert (answer["status"], answer["exit_code"], answer["logs"]) == ("failed", 3, "hi\n")


async def test_a_sandbox_on_the_fake_runtime(
    client: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    http, headers = client
    created = await http.post("/v1/sandboxes", headers=headers, json={})
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    files = f"/v1/sandboxes/{sandbox_id}/files"
    written = await http.put(files, headers=headers, params={"path": "d/x"}, content=b"data")
    assert written.json()[0]["path"] == "/home/user/d/x"
    ran = await run(http, headers, sandbox_id, ["cat", "/home/user/d/x"])
    assert (ran.stdout, ran.end.get("exitCode", 0)) == ("data", 0)
    assert (await http.delete(f"/v1/sandboxes/{sandbox_id}", headers=headers)).status_code == 200
