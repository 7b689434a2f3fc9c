"""Sandbox groups on real sandboxes (docs/design.md 14.6): a sandbox reaches the ports of
its group's sandboxes through its group proxy, and nothing else: not a sandbox outside
its group, not another tenant's in a group of the same name, not the host."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from ringfence.audit.signing import SealKey
from ringfence.backends.local import LocalExecutor
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import Role
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store import MemoryStore
from tests.server._envd import run
from tests.server.conftest import _uvicorn
from tests.server.test_ports_local import start_app

APP = Path(__file__).with_name("port_app.py")
PORT = 8000
# Run in a sandbox: each (name, "get" | "connect", target) through the group proxy, as
# [status, body]; status 0: the proxy could not be reached at all.
PROBE = r"""
import json, os, socket, sys, urllib.error, urllib.request
proxy = os.environ.get("RINGFENCE_GROUP_PROXY", "http://127.0.0.1:49982")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
def get(url):
    try:
        with opener.open(url, timeout=10) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except Exception as e:
        return [0, repr(e)]
def connect(target):
    try:
        s = socket.create_connection(("127.0.0.1", 49982), timeout=10)
    except OSError as e:
        return [0, repr(e)]
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = s.recv(65536)
    status = int(head.split()[1])
    if status != 200:
        return [status, head.decode()]
    s.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return [200, data.decode()]
print(json.dumps({n: get(t) if k == "get" else connect(t) for n, k, t in json.loads(sys.argv[1])}))
"""


class Tenants:
    def __init__(self, client: httpx.AsyncClient, acme: str, globex: str, admin: str) -> None:
        self.client = client
        self.acme = {"Authorization": f"Bearer {acme}"}
        self.globex = {"Authorization": f"Bearer {globex}"}
        self.admin = {"Authorization": f"Bearer {admin}"}

    async def sandbox(self, headers: dict[str, str], **spec: object) -> str:
        response = await self.client.post("/v1/sandboxes", headers=headers, json=spec)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def probe(self, sandbox_id: str, asks: list[tuple[str, str, str]]) -> dict[str, list]:
        ran = await run(
            self.client, self.acme, sandbox_id, ["python3", "-c", PROBE, json.dumps(asks)]
        )
        assert ran.stdout, ran
        result: dict[str, list] = json.loads(ran.stdout)
        return result


@pytest.fixture
async def tenants(local_host: object) -> AsyncIterator[Tenants]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    data_dir = Path(tempfile.mkdtemp(prefix="rf-groups-"))
    config = Config(pool_sizes={}, data_dir=data_dir)
    store = MemoryStore()
    services = await build_services(
        config, store=store, executor=LocalExecutor(config, host=local_host),
        seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    acme = await mint_key(store, "acme", Role.AGENT)
    globex = await mint_key(store, "globex", Role.AGENT)
    admin = await mint_key(store, "acme", Role.ADMIN)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, data_dir, ignore_errors=True)
        await stack.enter_async_context(app.router.lifespan_context(app))
        url = await stack.enter_async_context(_uvicorn(app))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=60))
        yield Tenants(client, acme, globex, admin)


@pytest.fixture
def host_service() -> Iterator[int]:
    """A server on the HOST's loopback, which no group may reach."""
    process = subprocess.Popen([sys.executable, str(APP), "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield int(process.stdout.readline().split()[1])
    finally:
        process.kill()
        process.wait()


async def test_a_group_reaches_its_peers_ports_and_nothing_else(
    tenants: Tenants, host_service: int
) -> None:
    source = await tenants.sandbox(tenants.acme, group="team")
    peer = await tenants.sandbox(tenants.acme, group="team")
    outside = await tenants.sandbox(tenants.acme)
    other_group = await tenants.sandbox(tenants.acme, group="other")
    other_tenant = await tenants.sandbox(tenants.globex, group="team")
    for sandbox_id, headers in (
        (peer, tenants.acme), (outside, tenants.acme), (other_group, tenants.acme),
        (other_tenant, tenants.globex),
    ):  # fmt: skip
        await start_app(tenants.client, headers, sandbox_id, PORT)
    seen = await tenants.probe(
        source,
        [
            ("by id", "get", f"http://{peer}:{PORT}/echo?x=1"),
            ("by label", "get", f"http://{PORT}-{peer}/echo"),
            ("connect", "connect", f"{peer}:{PORT}"),
            ("outside the group", "get", f"http://{outside}:{PORT}/echo"),
            ("another group", "get", f"http://{other_group}:{PORT}/echo"),
            ("another tenant, same group name", "get", f"http://{other_tenant}:{PORT}/echo"),
            ("connect outside", "connect", f"{outside}:{PORT}"),
            ("a reserved port", "get", f"http://{peer}:3128/"),
            ("the group port", "get", f"http://{peer}:49982/"),
            ("the host's port, on the peer", "get", f"http://{peer}:{host_service}/echo"),
            ("the host by address", "get", f"http://127.0.0.1:{host_service}/echo"),
            ("the host by name", "get", f"http://localhost:{host_service}/echo"),
            ("connect to the host", "connect", f"127.0.0.1:{host_service}"),
            ("nothing there", "get", f"http://{peer}:8001/"),
        ],
    )
    assert seen["by id"][0] == 200 and json.loads(seen["by id"][1])["path"] == "/echo?x=1"
    assert seen["by label"][0] == 200
    assert seen["connect"][0] == 200 and '"path": "/echo"' in seen["connect"][1]
    for refused in (
        "outside the group", "another group", "another tenant, same group name",
        "connect outside", "a reserved port", "the group port", "the host by name",
    ):  # fmt: skip
        assert seen[refused][0] == 403, (refused, seen[refused])
    assert seen["the host's port, on the peer"][0] == 502  # the peer's loopback: nothing
    assert seen["the host by address"][0] == 400
    assert seen["connect to the host"][0] == 400
    assert seen["nothing there"][0] == 502
    # The peer's record names who reached it (its key's record is start_app's probe).
    by_group = (f"sandbox:{source}", "group", "group")
    deadline = time.monotonic() + 10
    while True:
        records = (
            await tenants.client.get(
                "/v1/audit",
                params={"target": f"sandbox:{peer}", "action": "sandbox.port_open"},
                headers=tenants.admin,
            )
        ).json()
        seen_actors = {(r["actor"], r["details"]["access"], r["details"]["via"]) for r in records}
        if by_group in seen_actors or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert by_group in seen_actors


async def test_a_sandbox_in_no_group_has_no_group_proxy(tenants: Tenants) -> None:
    alone = await tenants.sandbox(tenants.acme)
    peer = await tenants.sandbox(tenants.acme, group="team")
    await start_app(tenants.client, tenants.acme, peer, PORT)
    seen = await tenants.probe(alone, [("to a grouped one", "connect", f"{peer}:{PORT}")])
    assert seen["to a grouped one"][0] == 0  # nothing listens there: off by default


async def test_the_group_port_is_not_reachable_from_outside(tenants: Tenants) -> None:
    """A preview URL to the group port would let an outside caller speak as the sandbox."""
    grouped = await tenants.sandbox(tenants.acme, group="team", public_traffic=True)
    response = await tenants.client.get(f"/v1/sandboxes/{grouped}/ports/49982/")
    assert response.status_code == 403
