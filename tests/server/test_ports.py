"""Preview URLs (docs/ports.md) over real HTTP, on the fakes: who may reach a port, what
crosses, streaming, WebSocket, bounds and the audit record.

A fake sandbox runs on the host's network, so the "server in the sandbox" here is a
process on the host's loopback; that a real sandbox's loopback is its own (and the host's
unreachable) is ``test_ports_local.py``'s.
"""

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
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import websocket

from ringfence.audit.signing import SealKey
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import Role
from ringfence.sandboxd.browser import AGENT_PORT, CDP_PORT
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store import MemoryStore
from ringfence.testing.fakes import FakeExecutor, FakeSandboxRuntime
from tests.server.conftest import _uvicorn

APP = Path(__file__).with_name("port_app.py")
DOMAIN = "preview.test"
MAX_CONNECTIONS = 3


@dataclass
class Served:
    url: str
    client: httpx.AsyncClient
    acme: str  # tenant acme's key
    globex: str  # tenant globex's key
    go: Path  # the port app's /stream goes on once this exists
    admin: str  # tenant acme's admin key (reads the audit record)

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.acme}"}

    async def sandbox(self, **spec: object) -> str:
        response = await self.client.post("/v1/sandboxes", headers=self.auth(), json=spec)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def audit(self, sandbox_id: str, at_least: int) -> list[dict[str, object]]:
        """The port_open records of the sandbox, once ``at_least`` are written (batched)."""
        deadline = time.monotonic() + 10
        while True:
            records: list[dict[str, object]] = (
                await self.client.get(
                    "/v1/audit",
                    params={"target": f"sandbox:{sandbox_id}", "action": "sandbox.port_open"},
                    headers=self.auth(self.admin),
                )
            ).json()
            assert isinstance(records, list), records
            if len(records) >= at_least or time.monotonic() > deadline:
                return records
            await asyncio.sleep(0.05)


@pytest.fixture
def port_app(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The port app on the host's loopback (where a fake sandbox's loopback is)."""
    go = tmp_path / "go"
    process = subprocess.Popen(
        [sys.executable, str(APP), "0"], stdout=subprocess.PIPE, text=True,
        env={"PORT_APP_GO": str(go), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening "), line
        yield int(line.split()[1]), go
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def overrides() -> dict[str, object]:
    """Config settings of one test's server (parametrize ``overrides`` to set some)."""
    return {}


@pytest.fixture
async def served(port_app: tuple[int, Path], overrides: dict[str, object]) -> AsyncIterator[Served]:
    data_dir = Path(tempfile.mkdtemp(prefix="rf-ports-"))
    config = Config(
        pool_sizes={}, data_dir=data_dir, ports_domain=DOMAIN,
        max_port_connections_per_sandbox=MAX_CONNECTIONS, **overrides,  # type: ignore[arg-type]
    )  # fmt: skip
    store = MemoryStore()
    services = await build_services(
        config, store=store, executor=FakeExecutor(config), runtime=FakeSandboxRuntime(config),
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
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield Served(url, client, acme, globex, port_app[1], admin)


@pytest.fixture
def port(port_app: tuple[int, Path]) -> int:
    return port_app[0]


def _echoed(response: httpx.Response) -> dict[str, object]:
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def _headers_seen(echo: dict[str, object]) -> dict[str, str]:
    pairs = echo["headers"]
    assert isinstance(pairs, list)
    return {name: value for name, value in pairs}


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_a_key_of_its_tenant_reaches_the_port_by_path(served: Served, port: int) -> None:
    sandbox_id = await served.sandbox()
    response = await served.client.get(
        f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo/a%2Fb?x=1&y=2", headers=served.auth()
    )
    echo = _echoed(response)
    assert echo["path"] == "/echo/a%2Fb?x=1&y=2"  # the rest of the path, as it was encoded
    seen = _headers_seen(echo)
    assert seen["x-forwarded-prefix"] == f"/v1/sandboxes/{sandbox_id}/ports/{port}"
    assert seen["x-forwarded-for"] == "127.0.0.1"
    # The path route shares Ringfence's origin: the page runs in an opaque origin and
    # sets no cookie there.
    assert "sandbox allow-scripts" in response.headers["content-security-policy"]
    assert "allow-same-origin" not in response.headers["content-security-policy"]
    assert "set-cookie" not in response.headers
    bare = await served.client.get(
        f"/v1/sandboxes/{sandbox_id}/ports/{port}", headers=served.auth()
    )
    assert _echoed(bare)["path"] == "/"


async def test_the_host_name_form_reaches_the_port_with_the_apps_own_cookies(
    served: Served, port: int
) -> None:
    sandbox_id = await served.sandbox()
    response = await served.client.get(
        "/echo?q=1",
        headers={
            **served.auth(),
            "Host": f"{port}-{sandbox_id}.{DOMAIN.upper()}:443",
            "Cookie": "app=2; ringfence_console=stolen; other=3",
        },
    )
    echo = _echoed(response)
    assert echo["path"] == "/echo?q=1"
    seen = _headers_seen(echo)
    assert seen["cookie"] == "app=2; other=3"  # the console's own is never passed on
    assert seen["host"] == f"{port}-{sandbox_id}.{DOMAIN.upper()}:443"
    assert "x-forwarded-prefix" not in seen
    assert response.headers["set-cookie"] == "app=1; Path=/"  # its own origin: its cookies
    assert "content-security-policy" not in response.headers


async def test_ringfence_credentials_never_reach_the_sandbox(served: Served, port: int) -> None:
    sandbox_id = await served.sandbox()
    for headers in (
        {"Authorization": f"Bearer {served.acme}", "Cookie": "ringfence_console=s; app=1"},
        {"X-API-Key": served.acme, "Authorization": "Basic dXNlcjpwYXNz"},
    ):
        echo = _echoed(
            await served.client.get(
                f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo",
                headers={**headers, "E2B-Sandbox-Id": sandbox_id, "X-Forwarded-Host": "x"},
            )
        )
        seen = _headers_seen(echo)
        assert served.acme not in json.dumps(echo)
        assert "cookie" not in seen  # the path route's cookies are Ringfence's origin's
        assert "x-api-key" not in seen and "e2b-sandbox-id" not in seen
        assert seen["x-forwarded-host"] != "x"  # Ringfence's own, not the client's
    # An Authorization that is not a Ringfence key is the app's own: it passes.
    assert seen["authorization"] == "Basic dXNlcjpwYXNz"


async def test_no_credential_or_another_tenants_key_cannot_reach_a_port(
    served: Served, port: int
) -> None:
    sandbox_id = await served.sandbox()
    path = f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo"
    anonymous = await served.client.get(path)
    assert _error(anonymous) == (401, "unauthenticated")
    assert _error(await served.client.get(path, headers=served.auth(served.globex))) == (
        404,
        "not_found",
    )
    forged = {"E2B-Traffic-Access-Token": f"acme.x.y.{'A' * 43}"}
    assert _error(await served.client.get(path, headers=forged)) == (401, "unauthenticated")
    wrong_key = {"Authorization": "Bearer rf_0123456789abcdef_" + "A" * 43}
    assert _error(await served.client.get(path, headers=wrong_key)) == (401, "unauthenticated")
    # An anonymous caller learns nothing about which sandboxes exist.
    missing = await served.client.get(f"/v1/sandboxes/sbnothere/ports/{port}/echo")
    assert _error(missing) == (401, "unauthenticated")
    by_host = await served.client.get("/echo", headers={"Host": f"{port}-{sandbox_id}.{DOMAIN}"})
    assert _error(by_host) == (401, "unauthenticated")


async def test_public_traffic_admits_anyone(served: Served, port: int) -> None:
    sandbox_id = await served.sandbox(public_traffic=True)
    got = await served.client.get(f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo")
    assert _echoed(got)["method"] == "GET"
    by_host = await served.client.get("/", headers={"Host": f"{port}-{sandbox_id}.{DOMAIN}"})
    assert _echoed(by_host)["path"] == "/"
    info = (await served.client.get(f"/v1/sandboxes/{sandbox_id}", headers=served.auth())).json()
    assert info["public_traffic"] is True
    # Another tenant's key is still another tenant's: not found, public or not.
    other = await served.client.get(
        f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo", headers=served.auth(served.globex)
    )
    assert _error(other) == (404, "not_found")


async def test_a_port_nothing_listens_on_is_a_502_naming_it(served: Served) -> None:
    sandbox_id = await served.sandbox()
    probe = __import__("socket").socket()
    probe.bind(("127.0.0.1", 0))
    free = probe.getsockname()[1]
    probe.close()
    response = await served.client.get(
        f"/v1/sandboxes/{sandbox_id}/ports/{free}/", headers=served.auth()
    )
    assert _error(response) == (502, "port_not_listening")
    assert f"port {free}" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "segment", ["0", "65536", "99999", "abc", "080", "-1", "8080a", "%38%30", "1e3", " 80"]
)
async def test_a_port_out_of_range_or_not_a_number_is_a_400(served: Served, segment: str) -> None:
    sandbox_id = await served.sandbox()
    response = await served.client.get(
        f"/v1/sandboxes/{sandbox_id}/ports/{segment}/", headers=served.auth()
    )
    assert _error(response) == (400, "invalid_request")


@pytest.mark.parametrize(
    "host",
    [
        f"abc-sb1.{DOMAIN}",
        f"80.{DOMAIN}",
        f"80-sb1.x.{DOMAIN}",
        DOMAIN,
        f"080-sb1.{DOMAIN}",
        f"70000-sb1.{DOMAIN}",
        f"80-SB_1.{DOMAIN}",
    ],
)
async def test_a_name_under_the_preview_domain_that_is_no_preview_url_is_a_400(
    served: Served, host: str
) -> None:
    response = await served.client.get("/v1/sandboxes", headers={**served.auth(), "Host": host})
    assert _error(response) == (400, "invalid_request")  # never the API under that name


async def test_garbage_in_the_sandbox_id_is_a_400(served: Served, port: int) -> None:
    for sandbox_id in ("sb..x", "sb%00x", "sb%0d%0aX-Injected:1"):
        response = await served.client.get(
            f"/v1/sandboxes/{sandbox_id}/ports/{port}/", headers=served.auth()
        )
        assert _error(response) == (400, "invalid_request"), sandbox_id


async def test_ringfences_own_ports_in_the_sandbox_are_refused(served: Served) -> None:
    sandbox_id = await served.sandbox(public_traffic=True)
    for reserved in (3128, 53):
        response = await served.client.get(f"/v1/sandboxes/{sandbox_id}/ports/{reserved}/")
        assert _error(response) == (403, "forbidden")


async def test_the_browsers_ports_in_the_sandbox_are_refused_by_path_and_host(
    served: Served,
) -> None:
    """The browser agent and Chromium's DevTools port would let a caller drive the
    sandbox's browser as the server does (its session's cookies, unaudited): refused to
    every caller, the tenant's own key, E2B's traffic token and the public alike."""
    created = await served.client.post(
        "/sandboxes", json={"templateID": "base", "allow_internet_access": False},
        headers={"X-API-KEY": served.acme},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    sandbox_id, token = created.json()["sandboxID"], created.json()["trafficAccessToken"]
    public = await served.sandbox(public_traffic=True)
    for reserved in (AGENT_PORT, CDP_PORT):
        for target, credentials in (
            (sandbox_id, served.auth()),
            (sandbox_id, {"E2B-Traffic-Access-Token": token}),
            (public, {}),
        ):
            by_path = await served.client.get(
                f"/v1/sandboxes/{target}/ports/{reserved}/health", headers=credentials
            )
            assert _error(by_path) == (403, "forbidden"), (reserved, credentials)
            by_host = await served.client.get(
                "/json/version", headers={**credentials, "Host": f"{reserved}-{target}.{DOMAIN}"}
            )
            assert _error(by_host) == (403, "forbidden"), (reserved, credentials)


async def test_request_smuggling_does_not_reach_the_sandbox_as_a_second_request(
    served: Served, port: int
) -> None:
    """Both framings at once (chunked wins, RFC 9112 6.3): what reaches the sandbox is one
    request, framed by Ringfence; the bytes behind it are a next request to Ringfence, never
    to the sandbox."""
    sandbox_id = await served.sandbox()
    host, _, server_port = served.url.removeprefix("http://").partition(":")
    smuggled = (
        f"POST /v1/sandboxes/{sandbox_id}/ports/{port}/echo HTTP/1.1\r\n"
        f"Host: x\r\nAuthorization: Bearer {served.acme}\r\n"
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        "0\r\n\r\nGET /echo/smuggled HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, int(server_port))
    writer.write(smuggled)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)  # until the server closes
    writer.close()
    first, _, second = answer.partition(b"HTTP/1.1 ")[2].partition(b"HTTP/1.1 ")
    echo = json.loads(first.partition(b"\r\n\r\n")[2])
    assert (echo["method"], echo["path"], echo["body"]) == ("POST", "/echo", "")
    assert second.startswith(b"404"), second[:200]  # Ringfence's own answer, no sandbox's
    assert b"smuggled" not in first


async def test_a_streamed_answer_arrives_as_it_comes(served: Served, port: int) -> None:
    sandbox_id = await served.sandbox()
    path = f"/v1/sandboxes/{sandbox_id}/ports/{port}/stream"
    async with served.client.stream("GET", path, headers=served.auth()) as response:
        chunks = response.aiter_text()
        assert await asyncio.wait_for(anext(chunks), 10) == "one\n"  # before the answer ends
        served.go.touch()
        rest = "".join([chunk async for chunk in chunks])
    assert rest == "two\n"


async def test_a_request_body_is_streamed_to_the_sandbox(served: Served, port: int) -> None:
    sandbox_id = await served.sandbox()

    async def body() -> AsyncIterator[bytes]:
        for part in (b"a" * 100_000, b"b" * 100_000):
            yield part

    response = await served.client.post(
        f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo", headers=served.auth(), content=body()
    )
    echo = _echoed(response)
    assert echo["body"] == "a" * 100_000 + "b" * 100_000
    assert _headers_seen(echo)["transfer-encoding"] == "chunked"
    big = b"x" * (8 << 20)  # above the API's body limit: a preview URL's body is the app's
    response = await served.client.post(
        f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo", headers=served.auth(), content=big
    )
    assert len(str(_echoed(response)["body"])) == len(big)


async def test_connections_to_one_sandbox_are_bounded(served: Served, port: int) -> None:
    sandbox_id = await served.sandbox()
    other_id = await served.sandbox()
    path = f"/v1/sandboxes/{sandbox_id}/ports/{port}/stream"
    async with contextlib.AsyncExitStack() as held:
        for _ in range(MAX_CONNECTIONS):
            response = await held.enter_async_context(
                served.client.stream("GET", path, headers=served.auth())
            )
            assert response.status_code == 200
        refused = await served.client.get(path + "?now", headers=served.auth())
        assert _error(refused) == (429, "too_many_requests")
        elsewhere = await served.client.get(
            f"/v1/sandboxes/{other_id}/ports/{port}/stream?now", headers=served.auth()
        )
        assert elsewhere.status_code == 200  # the bound is per sandbox
        served.go.touch()
    again = await served.client.get(path + "?now", headers=served.auth())
    assert again.status_code == 200  # closed connections no longer count


async def test_each_route_is_audited_at_its_first_connection_then_counted(
    served: Served, port: int
) -> None:
    sandbox_id = await served.sandbox(public_traffic=True)
    path = f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo"
    for _ in range(10):
        assert (await served.client.get(path, headers=served.auth())).status_code == 200
    assert (await served.client.get(path)).status_code == 200
    records = await served.audit(sandbox_id, at_least=3)
    seen = sorted(
        (str(r["actor"]), r["details"]["connections"], r["details"]["access"])  # type: ignore[index]
        for r in records
    )
    key_id = served.acme.split("_")[1]
    assert seen == [(key_id, 1, "key"), (key_id, 10, "key"), ("public", 1, "public")]
    assert all(r["details"]["port"] == port for r in records)  # type: ignore[index]


async def test_e2b_tokens_and_host_names_reach_ports_and_envd(served: Served, port: int) -> None:
    """E2B's create answers the preview domain (what ``get_host`` builds on) and a traffic
    token; envd's own host name goes to E2B's door."""
    created = await served.client.post(
        "/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": served.acme}
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["domain"] == DOMAIN
    sandbox_id, token = body["sandboxID"], body["trafficAccessToken"]
    host = f"{port}-{sandbox_id}.{body['domain']}"
    echo = _echoed(
        await served.client.get("/echo", headers={"Host": host, "E2B-Traffic-Access-Token": token})
    )
    assert token not in json.dumps(echo)
    other = await served.sandbox()  # the token is its sandbox's only
    refused = await served.client.get(
        "/echo", headers={"Host": f"{port}-{other}.{DOMAIN}", "E2B-Traffic-Access-Token": token}
    )
    assert _error(refused) == (401, "unauthenticated")
    health = await served.client.get(
        "/health",
        headers={"Host": f"49983-{sandbox_id}.{DOMAIN}", "X-Access-Token": body["envdAccessToken"]},
    )
    assert health.status_code == 204


def _websocket(url: str, **options: object) -> list[object]:
    """Talk to the port app's /ws: a text and a binary message, then close with 4001."""
    ws = websocket.create_connection(url, timeout=10, **options)
    try:
        ws.send("hello")
        text = ws.recv()
        ws.send_binary(b"\x01\x02\x03")
        binary = ws.recv()
        ws.send_close(4001)
        ws.recv()
        return [text, binary, ws.status]
    finally:
        ws.close()


async def test_a_websocket_passes_by_path_and_by_host(served: Served, port: int) -> None:
    sandbox_id = await served.sandbox()
    ws_url = served.url.replace("http://", "ws://")
    by_path = await asyncio.to_thread(
        _websocket, f"{ws_url}/v1/sandboxes/{sandbox_id}/ports/{port}/ws",
        header=[f"Authorization: Bearer {served.acme}"],
    )  # fmt: skip
    assert by_path[:2] == ["echo:hello", b"\x03\x02\x01"]
    by_host = await asyncio.to_thread(
        _websocket, f"{ws_url}/ws", host=f"{port}-{sandbox_id}.{DOMAIN}",
        header=[f"X-API-Key: {served.acme}"],
    )  # fmt: skip
    assert by_host[:2] == ["echo:hello", b"\x03\x02\x01"]


async def test_a_websocket_without_credentials_is_refused(served: Served, port: int) -> None:
    sandbox_id = await served.sandbox()
    ws_url = served.url.replace("http://", "ws://")
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        await asyncio.to_thread(_websocket, f"{ws_url}/v1/sandboxes/{sandbox_id}/ports/{port}/ws")
    assert refused.value.status_code == 401
    with pytest.raises(websocket.WebSocketBadStatusException) as other:
        await asyncio.to_thread(
            _websocket, f"{ws_url}/v1/sandboxes/{sandbox_id}/ports/{port}/ws",
            header=[f"Authorization: Bearer {served.globex}"],
        )  # fmt: skip
    assert other.value.status_code == 404


async def test_the_openapi_document_describes_the_path_route(served: Served) -> None:
    document = (await served.client.get("/openapi.json")).json()
    route = document["paths"]["/v1/sandboxes/{sandbox_id}/ports/{port}/{path}"]
    assert set(route) == {"get", "post", "put", "patch", "delete"}
    assert {"400", "401", "404", "429", "502"} <= set(route["get"]["responses"])
    schemes = document["components"]["securitySchemes"]
    assert all(name in schemes for option in route["get"]["security"] for name in option)


async def test_one_callers_requests_share_a_kept_alive_connection_never_anothers(
    served: Served, port: int
) -> None:
    sandbox_id = await served.sandbox(public_traffic=True)
    path = f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo"
    first = _echoed(await served.client.get(path, headers=served.auth()))
    second = _echoed(await served.client.get(path, headers=served.auth()))
    assert first["peer"] == second["peer"]  # the tunnel was kept for the next request
    anonymous = _echoed(await served.client.get(path))
    assert anonymous["peer"] != first["peer"]  # another caller: a connection of its own
    closing = _echoed(
        await served.client.get(path, headers={**served.auth(), "Connection": "close"})
    )
    assert closing["peer"] == first["peer"]  # the client's Connection header is its own hop's
    after = _echoed(await served.client.get(path, headers=served.auth()))
    assert after["peer"] != first["peer"]  # a new client connection: never an old one's tunnel


async def test_a_kept_alive_connection_the_sandbox_closed_is_not_a_failure(
    served: Served, port: int
) -> None:
    sandbox_id = await served.sandbox()
    path = f"/v1/sandboxes/{sandbox_id}/ports/{port}/echo"
    dropped = _echoed(await served.client.get(path + "?drop", headers=served.auth()))
    for _ in range(3):
        again = _echoed(await served.client.get(path, headers=served.auth()))
        assert again["peer"] != dropped["peer"]


def test_the_routes_counted_for_the_audit_record_are_bounded() -> None:
    """A caller trying every port of a public sandbox does not grow the counts unbounded."""
    from ringfence.service import ports as ports_module

    sandbox_id = "sb0123"
    ports = ports_module.Ports(_Live(), max_per_sandbox=4)  # type: ignore[arg-type]
    saved, ports_module._COUNTED = ports_module._COUNTED, 8
    try:
        for port in range(1000, 1020):
            ports._audit("acme", ports_module.PortCaller.anonymous(), sandbox_id, port, "path")
        assert len(ports._opened) <= 8
    finally:
        ports_module._COUNTED = saved


def test_an_anonymous_scan_of_ports_is_a_few_records_even_as_the_counts_churn() -> None:
    """Review 2a #4: each new (sandbox, port, "public") was a record, and past the counted
    routes' bound they were all cleared: a scan made a record per request, for ever. Now
    anonymous callers are one route per sandbox (with its distinct ports), and the least
    recently used route is forgotten, not all."""
    from ringfence.service import ports as ports_module

    recorded: list[dict[str, object]] = []

    class Recording(_Live):
        def record(self, *args: object, details: dict[str, object], **kwargs: object) -> None:
            recorded.append(details)

    ports = ports_module.Ports(Recording(), max_per_sandbox=4)  # type: ignore[arg-type]
    saved, ports_module._COUNTED = ports_module._COUNTED, 8
    key = ports_module.PortCaller("acme", "key1", "key")
    try:
        for _ in range(3):
            for port in range(1, 1001):
                ports._audit("acme", ports_module.PortCaller.anonymous(), "sbV", port, "path")
                ports._audit("acme", key, f"sbA{port % 20}", port, "path")  # churns the table
        anonymous = [d for d in recorded if d["access"] == "public"]
        # connections 1, 10, 100, 1000 and distinct ports 10, 100, 1000: never one a port
        assert [(d["connections"], d["ports"]) for d in anonymous] == [
            (1, 1), (10, 10), (100, 100), (1000, 1000),
        ]  # fmt: skip
        assert len(ports._opened) <= 8
    finally:
        ports_module._COUNTED = saved


class _Live:
    """What ``Ports`` asks of the sandboxes, for a sandbox that runs."""

    def live_tenant(self, sandbox_id: str) -> str | None:
        return "acme"

    def record(self, *args: object, **kwargs: object) -> None:
        pass


async def test_traffic_through_a_port_keeps_an_idle_pausing_sandbox_awake(
    served: Served, port: int
) -> None:
    """auto_pause counts requests: a WebSocket's messages are requests too, however long
    it stays open; once they stop, the sandbox pauses as it would have."""
    sandbox_id = await served.sandbox(auto_pause=1)
    ws_url = served.url.replace("http://", "ws://")

    def chat() -> None:
        ws = websocket.create_connection(
            f"{ws_url}/v1/sandboxes/{sandbox_id}/ports/{port}/ws", timeout=10,
            header=[f"Authorization: Bearer {served.acme}"],
        )  # fmt: skip
        try:
            until = time.monotonic() + 3
            while time.monotonic() < until:
                ws.send("ping")
                assert ws.recv() == "echo:ping"
                time.sleep(0.2)
        finally:
            ws.close()

    await asyncio.to_thread(chat)
    info = await served.client.get(f"/v1/sandboxes/{sandbox_id}", headers=served.auth())
    assert info.json()["state"] == "running"  # 3 s of traffic past a 1 s auto_pause
    deadline = time.monotonic() + 20
    while info.json()["state"] != "paused":
        assert time.monotonic() < deadline, "it never paused once the traffic stopped"
        await asyncio.sleep(0.1)
        info = await served.client.get(f"/v1/sandboxes/{sandbox_id}", headers=served.auth())


class _ContentLengthFirst:
    """A sandbox's server that frames requests by Content-Length only (as hand-rolled
    servers do) and answers each with the number of its connection: what Ringfence sends
    it, and which upstream connection answered whom, are both visible."""

    def __init__(self, answer: bytes | None = None) -> None:
        self.answer = answer  # this whole answer to every request, if given
        self.heads: list[bytes] = []
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                body = b"%d" % number
                answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                writer.write(self.answer or answer)
                await writer.drain()
        writer.close()


async def test_a_request_with_both_framings_reaches_the_sandbox_with_one(served: Served) -> None:
    """Review 2a #1a: Content-Length with Transfer-Encoding went on with both, and a
    server reading Content-Length first took the chunk data for a next request."""
    sandbox_id = await served.sandbox(public_traffic=True)
    upstream = _ContentLengthFirst()
    async with upstream as upstream_port:
        smuggled = b"GET /poison HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n"
        size = b"%x\r\n" % len(smuggled)
        attack = (
            (
                f"POST /v1/sandboxes/{sandbox_id}/ports/{upstream_port}/a HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {len(size)}\r\nTransfer-Encoding: chunked\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            + size
            + smuggled
            + b"\r\n0\r\n\r\n"
        )
        host, _, server_port = served.url.removeprefix("http://").partition(":")
        reader, writer = await asyncio.open_connection(host, int(server_port))
        writer.write(attack)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # until the server closes
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        (head,) = upstream.heads[:1]
        names = [line.partition(b":")[0].lower() for line in head.split(b"\r\n")[1:] if line]
        assert b"transfer-encoding" in names and b"content-length" not in names, head


async def test_anonymous_visitors_never_share_a_connection_to_the_sandbox(
    served: Served,
) -> None:
    """Review 2a #1b: every anonymous visitor is the actor "public"; keyed by actor, one
    visitor's kept-alive upstream connection (desynchronised or not) answered the next."""
    sandbox_id = await served.sandbox(public_traffic=True)
    async with _ContentLengthFirst() as upstream_port:
        path = f"/v1/sandboxes/{sandbox_id}/ports/{upstream_port}/x"
        async with (
            httpx.AsyncClient(base_url=served.url) as one,
            httpx.AsyncClient(base_url=served.url) as other,
        ):
            answered = [(await c.get(path)).text for c in (one, other, one, other)]
        assert answered[0] == answered[2] and answered[1] == answered[3]  # each kept its own
        assert answered[0] != answered[1], answered  # never the other visitor's


async def test_a_websocket_message_is_bounded_in_utf8_bytes_not_characters(
    served: Served, port: int
) -> None:
    """Review 2a #2: text was counted in characters against 16 Mi (an emoji is 4 bytes,
    and a str of them 4 bytes a character): the sandbox's echo of 300 Ki emoji (1.2 MB of
    UTF-8, fewer characters than the 1 MiB bound) closes the WebSocket with 1009."""
    sandbox_id = await served.sandbox()
    url = served.url.replace("http://", "ws://") + f"/v1/sandboxes/{sandbox_id}/ports/{port}/ws"

    def talk() -> tuple[object, object]:
        ws = websocket.create_connection(
            url, timeout=10, header=[f"Authorization: Bearer {served.acme}"]
        )
        try:
            ws.send("small")
            small = ws.recv()
            ws.send("\U0001f600" * (300 * 1024))
            opcode, frame = ws.recv_data(control_frame=True)
            return small, (opcode, int.from_bytes(frame[:2], "big"))
        finally:
            ws.close()

    small, closed = await asyncio.to_thread(talk)
    assert small == "echo:small"
    assert closed == (websocket.ABNF.OPCODE_CLOSE, 1009)


@pytest.mark.parametrize("overrides", [{"max_relayed_websockets": 1}])
async def test_relayed_websockets_are_bounded_server_wide(served: Served, port: int) -> None:
    """Review 2a #2: WebSockets had no bound across the server (each holds up to about
    twice a message): past ``max_relayed_websockets`` a WebSocket is refused with 429,
    and a slot comes back when one closes."""
    sandbox_id = await served.sandbox()
    other = await served.sandbox()
    ws_url = served.url.replace("http://", "ws://")
    auth = [f"Authorization: Bearer {served.acme}"]

    def opened(sandbox: str) -> websocket.WebSocket:
        url = f"{ws_url}/v1/sandboxes/{sandbox}/ports/{port}/ws"
        return websocket.create_connection(url, timeout=10, header=auth)

    def refused(sandbox: str) -> int:
        try:
            opened(sandbox).close()
        except websocket.WebSocketBadStatusException as refusal:
            return int(refusal.status_code)
        return 101

    held = await asyncio.to_thread(opened, sandbox_id)
    try:
        held.send("here")
        assert await asyncio.to_thread(held.recv) == "echo:here"
        assert await asyncio.to_thread(refused, other) == 429  # another sandbox: server-wide
    finally:
        held.close()
    deadline = time.monotonic() + 10
    while (status := await asyncio.to_thread(refused, other)) == 429:
        assert time.monotonic() < deadline, "the closed WebSocket's slot never came back"
        await asyncio.sleep(0.05)
    assert status == 101


async def test_an_answer_with_both_framings_is_relayed_chunked(served: Served) -> None:
    """Review 2a #6: the sandbox's Content-Length was kept beside the chunked body h11
    read, and the ASGI server failed the answer (a traceback per request)."""
    sandbox_id = await served.sandbox()
    upstream = _ContentLengthFirst(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n"
    )
    async with upstream as upstream_port:
        path = f"/v1/sandboxes/{sandbox_id}/ports/{upstream_port}/x"
        response = await served.client.get(path, headers=served.auth())
    assert (response.status_code, response.text) == (200, "hello")
    assert response.headers.get("content-length") in (None, "5")


async def test_the_path_route_drops_answer_headers_that_act_on_the_whole_origin(
    served: Served,
) -> None:
    """Review 2a #5: on the path route (Ringfence's origin) the sandbox could wipe the
    console's storage, pin HSTS, or redirect to another site; the host form is the app's
    own origin and keeps them."""
    sandbox_id = await served.sandbox()
    upstream = _ContentLengthFirst(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
        b'Clear-Site-Data: "cookies", "storage"\r\nLocation: https://evil.example/\r\n'
        b"Strict-Transport-Security: max-age=63072000; includeSubDomains; preload\r\n"
        b"Refresh: 0; url=https://evil.example/\r\nService-Worker-Allowed: /\r\n"
        b"X-App: kept\r\n\r\nok"
    )
    origin_wide = {"clear-site-data", "location", "strict-transport-security", "refresh",
                   "service-worker-allowed"}  # fmt: skip
    async with upstream as upstream_port:
        by_path = await served.client.get(
            f"/v1/sandboxes/{sandbox_id}/ports/{upstream_port}/x", headers=served.auth()
        )
        by_host = await served.client.get(
            "/x", headers={**served.auth(), "Host": f"{upstream_port}-{sandbox_id}.{DOMAIN}"}
        )
    assert by_path.headers["x-app"] == "kept"
    assert not origin_wide & set(by_path.headers), dict(by_path.headers)
    assert origin_wide <= set(by_host.headers)


@pytest.mark.parametrize(
    ("location", "kept"),
    [
        (b"/next", True), (b"page?x=1", True), (b"?q", True), (b"./a:b", True),
        (b"//evil.example/", False), (b"/\\evil.example", False), (b"\\\\evil.example", False),
        (b"https://evil.example/", False), (b"javascript:alert(1)", False),
        (b"/\t/evil.example", False),
    ],
)  # fmt: skip
def test_a_location_on_the_path_route_passes_only_when_it_stays_on_the_origin(
    location: bytes, kept: bool
) -> None:
    from ringfence.server.routes.ports import _path_answer_filter

    assert _path_answer_filter([(b"location", location)]) == (
        [(b"location", location)] if kept else []
    )


async def test_anonymous_visitors_cannot_lock_the_owner_out_of_its_public_sandbox(
    served: Served, port: int
) -> None:
    """Review 2a #3: the bound per sandbox was whoever held it, so anonymous visitors
    holding slow answers made the owner's own requests 429. They hold at most 3/4 of it."""
    sandbox_id = await served.sandbox(public_traffic=True)
    path = f"/v1/sandboxes/{sandbox_id}/ports/{port}/stream"
    share = max(1, MAX_CONNECTIONS * 3 // 4)
    async with contextlib.AsyncExitStack() as held:
        for _ in range(share):
            visitor = await held.enter_async_context(httpx.AsyncClient(base_url=served.url))
            response = await held.enter_async_context(visitor.stream("GET", path))
            assert response.status_code == 200
        async with httpx.AsyncClient(base_url=served.url) as one_more:
            assert _error(await one_more.get(path + "?now")) == (429, "too_many_requests")
        owner = await served.client.get(path + "?now", headers=served.auth())
        assert owner.status_code == 200  # its slots were kept
        served.go.touch()
