"""Preview URLs on real sandboxes (the local backend): a server a sandbox runs on its own
loopback is reached through Ringfence, HTTP and WebSocket, and a port route reaches
nothing but that loopback: never the host's own services."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import websocket

from ringfence.audit.signing import SealKey
from ringfence.backends.local import LocalExecutor
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import Role
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store import MemoryStore
from tests.server._envd import STREAM, envelope, messages
from tests.server.conftest import _uvicorn

APP = Path(__file__).with_name("port_app.py")
DOMAIN = "preview.test"
INSIDE_PORT = 8000


class Served:
    def __init__(self, url: str, client: httpx.AsyncClient, key: str) -> None:
        self.url = url
        self.client = client
        self.auth = {"Authorization": f"Bearer {key}"}
        self.key = key

    async def sandbox(self, **spec: object) -> str:
        response = await self.client.post("/v1/sandboxes", headers=self.auth, json=spec)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def start_app(self, sandbox_id: str, port: int = INSIDE_PORT) -> None:
        """Run the port app in the sandbox, in the background, and wait until it listens."""
        await start_app(self.client, self.auth, sandbox_id, port)


async def start_app(
    client: httpx.AsyncClient, auth: dict[str, str], sandbox_id: str, port: int
) -> None:
    """Run the port app in the sandbox, in the background, and wait until its port
    route answers (bounded)."""
    body = envelope(
        {
            "process": {
                "cmd": "/bin/sh",
                "args": ["-c", f'python3 -c "$APP" {port} >/tmp/app.log 2>&1 &'],
                "envs": {"APP": APP.read_text()},
            }
        }
    )
    async with client.stream(
        "POST", f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/Start",
        headers={**auth, **STREAM}, content=body,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        async for _ in messages(response):
            pass
    deadline = time.monotonic() + 20
    while True:
        got = await client.get(f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo", headers=auth)
        if got.status_code == 200:
            return
        assert got.status_code == 502, got.text
        assert time.monotonic() < deadline, "the app did not start listening"
        await asyncio.sleep(0.05)


@pytest.fixture
async def served(local_host: object) -> AsyncIterator[Served]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    data_dir = Path(tempfile.mkdtemp(prefix="rf-ports-"))
    config = Config(pool_sizes={}, data_dir=data_dir, ports_domain=DOMAIN)
    store = MemoryStore()
    services = await build_services(
        config, store=store, executor=LocalExecutor(config, host=local_host),
        seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    key = await mint_key(store, "acme", Role.AGENT)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, data_dir, ignore_errors=True)
        await stack.enter_async_context(app.router.lifespan_context(app))
        url = await stack.enter_async_context(_uvicorn(app))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield Served(url, client, key)


@pytest.fixture
def host_service() -> Iterator[int]:
    """The port app on the HOST's loopback: what a port route must never reach."""
    process = subprocess.Popen([sys.executable, str(APP), "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening "), line
        yield int(line.split()[1])
    finally:
        process.kill()
        process.wait()


def _websocket(url: str, **options: object) -> list[object]:
    ws = websocket.create_connection(url, timeout=10, **options)
    try:
        ws.send("hello")
        text = ws.recv()
        ws.send_binary(b"\x01\x02")
        return [text, ws.recv()]
    finally:
        ws.close()


async def test_a_server_on_the_sandboxs_loopback_is_reached_by_path_and_host(
    served: Served,
) -> None:
    sandbox_id = await served.sandbox()
    await served.start_app(sandbox_id)
    by_path = await served.client.get(
        f"/v1/sandboxes/{sandbox_id}/ports/{INSIDE_PORT}/echo?x=1", headers=served.auth
    )
    assert by_path.json()["path"] == "/echo?x=1"
    by_host = await served.client.get(
        "/echo", headers={**served.auth, "Host": f"{INSIDE_PORT}-{sandbox_id}.{DOMAIN}"}
    )
    assert by_host.json()["path"] == "/echo"
    ws_url = served.url.replace("http://", "ws://")
    through_path = await asyncio.to_thread(
        _websocket, f"{ws_url}/v1/sandboxes/{sandbox_id}/ports/{INSIDE_PORT}/ws",
        header=[f"Authorization: Bearer {served.key}"],
    )  # fmt: skip
    through_host = await asyncio.to_thread(
        _websocket, f"{ws_url}/ws", host=f"{INSIDE_PORT}-{sandbox_id}.{DOMAIN}",
        header=[f"Authorization: Bearer {served.key}"],
    )  # fmt: skip
    assert through_path == through_host == ["echo:hello", b"\x02\x01"]


async def test_a_port_route_cannot_reach_the_hosts_own_services(
    served: Served, host_service: int
) -> None:
    """The attack: a server listens on the host's 127.0.0.1 (and Ringfence's own API on
    another port); a sandbox's port route to either finds the sandbox's own loopback,
    where nothing listens."""
    assert httpx.get(f"http://127.0.0.1:{host_service}/echo").status_code == 200  # it is there
    sandbox_id = await served.sandbox(public_traffic=True)
    api_port = served.url.rsplit(":", 1)[1]
    for route in (
        f"/v1/sandboxes/{sandbox_id}/ports/{host_service}/echo",
        f"/v1/sandboxes/{sandbox_id}/ports/{api_port}/v1/sandboxes",
    ):
        response = await served.client.get(route, headers=served.auth)
        assert response.status_code == 502, response.text
        assert response.json()["error"]["code"] == "port_not_listening"
    by_host = await served.client.get(
        "/echo", headers={**served.auth, "Host": f"{host_service}-{sandbox_id}.{DOMAIN}"}
    )
    assert by_host.status_code == 502


async def test_a_paused_sandbox_is_resumed_by_its_port_route(served: Served) -> None:
    sandbox_id = await served.sandbox()
    await served.start_app(sandbox_id)
    paused = await served.client.post(
        f"/v1/sandboxes/{sandbox_id}/pause", headers=served.auth, json={"memory": True}
    )
    assert paused.status_code == 200, paused.text
    got = await served.client.get(
        f"/v1/sandboxes/{sandbox_id}/ports/{INSIDE_PORT}/echo", headers=served.auth
    )
    assert got.status_code == 200, got.text
    info = (await served.client.get(f"/v1/sandboxes/{sandbox_id}", headers=served.auth)).json()
    assert info["state"] == "running"


async def test_a_paused_sandbox_without_auto_resume_is_refused_clearly(served: Served) -> None:
    sandbox_id = await served.sandbox(auto_resume=False)
    await served.start_app(sandbox_id)
    paused = await served.client.post(
        f"/v1/sandboxes/{sandbox_id}/pause", headers=served.auth, json={"memory": True}
    )
    assert paused.status_code == 200, paused.text
    got = await served.client.get(
        f"/v1/sandboxes/{sandbox_id}/ports/{INSIDE_PORT}/echo", headers=served.auth
    )
    assert got.status_code == 409
    assert got.json()["error"]["code"] == "sandbox_not_running"
    assert "auto_resume" in got.json()["error"]["message"]
