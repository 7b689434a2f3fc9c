"""The browser routes end to end: real sandboxes, the real browser template and agent, a
local page served under a test name only the sandbox's egress policy allows; and a fake
agent (a process the test starts inside a real sandbox, on the agent's port) that answers
what no agent should, which the server answers with a 502 naming it, never a 500."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ringfence.audit.chain import AuditRecord
from ringfence.audit.signing import SealKey
from ringfence.backends.local import LocalExecutor
from ringfence.compose import Services, build_services
from ringfence.config import Config
from ringfence.models import AuditQuery, NetworkPolicy, Role
from ringfence.models.browser import ScrapeRequest
from ringfence.network import EgressGateway, Resolver
from ringfence.network.gateway import LISTENING
from ringfence.policy.egress import own_endpoints
from ringfence.sandboxd.browser import AGENT_PORT
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store import MemoryStore
from tests.server._envd import STREAM, start_body
from tests.templates._shared import Built, shared_template

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PAGES = "pages.test"  # the only name the tenant's egress policy allows
SECRET = "cookie-secret-" + "5eed" * 6
TYPED = "typed-secret-" + "beef" * 6


@dataclass
class Browsing:
    client: httpx.AsyncClient
    services: Services
    acme: dict[str, str]
    globex: dict[str, str]
    page: str  # the local page's URL, under PAGES (its /hang never answers)
    hung: asyncio.Event  # set once a request for /hang arrived

    async def records(self, action: str | None = None) -> list[AuditRecord]:
        await self.services.audit.flush()
        return list(await self.services.audit.query(AuditQuery(action=action, limit=1000)))

    async def sandbox(self, template: str = "browser", **spec: Any) -> str:
        created = await self.client.post(
            "/v1/sandboxes", headers=self.acme, json={"template": template, **spec}
        )
        assert created.status_code == 201, created.text
        sandbox_id: str = created.json()["id"]
        return sandbox_id


_PAGE = b"""<!doctype html><html lang="en"><head><title>Ringfence test page</title>
<meta name="description" content="a page for the browser routes"></head><body><main>
<h1>Hello from the page</h1><p id="out">static text</p>
<form onsubmit="event.preventDefault(); document.getElementById('out').textContent =
'signed in as ' + document.getElementById('name').value.length + ' chars';">
<input id="name"><button id="go" type="submit">Go</button></form>
<script>document.cookie; document.title = document.title;</script>
</main></body></html>"""


async def _serve_page(
    hung: asyncio.Event, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET /hang"):
            hung.set()
            await reader.read()  # until the browser (or its sandbox) goes away
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(_PAGE) + _PAGE
        )
        await writer.drain()
    writer.close()


@pytest.fixture(scope="module")
def browser_template() -> Built:
    return shared_template("browser")


@pytest.fixture
def pool_sizes() -> dict[str, int]:
    """The server's warm pool (parametrize it to have one)."""
    return {}


@pytest.fixture
async def browsing(
    local_host: object, browser_template: Built, pool_sizes: dict[str, int]
) -> AsyncIterator[Browsing]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    hung = asyncio.Event()
    server = await asyncio.start_server(lambda r, w: _serve_page(hung, r, w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    data_dir = Path(tempfile.mkdtemp(prefix="rf-data-"))
    policy = NetworkPolicy.model_validate(
        {"rules": [{"domain": PAGES, "cidr": "127.0.0.1/32", "ports": [port]}]}
    )
    config = Config(
        pool_sizes=pool_sizes, data_dir=data_dir,
        templates_dir=browser_template.rootfs.parent.parent,
        network_defaults={"acme": policy}, network_internal_cidrs=["127.0.0.1/32"],
        max_browser_result_bytes=2 << 20,  # the fake agent's "too much" is 3 MiB
    )  # fmt: skip
    gateway = EgressGateway(
        Resolver({PAGES: ["127.0.0.1"]}, system=False), own=own_endpoints(LISTENING)
    )
    store = MemoryStore()
    services = await build_services(
        config, store=store, executor=LocalExecutor(config, host=local_host, egress=gateway),
        seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    acme = await mint_key(store, "acme", Role.AGENT)
    globex = await mint_key(store, "globex", Role.AGENT)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, data_dir, ignore_errors=True)
        stack.push_async_callback(services.aclose)
        await stack.enter_async_context(server)
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://ringfence.test", timeout=120
        )
        await stack.enter_async_context(client)
        yield Browsing(
            client, services, {"Authorization": f"Bearer {acme}"},
            {"Authorization": f"Bearer {globex}"}, f"http://{PAGES}:{port}/", hung,
        )  # fmt: skip


def _error(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    return response.status_code, body["error"]["code"]


async def test_a_session_keeps_its_page_across_calls(browsing: Browsing) -> None:
    sandbox_id = await browsing.sandbox()
    base = f"/v1/sandboxes/{sandbox_id}/browser"
    status = await browsing.client.get(base, headers=browsing.acme)
    assert status.status_code == 200 and status.json()["running"] is False  # nothing started

    first = await browsing.client.post(
        f"{base}/scrape", headers=browsing.acme,
        json={"url": browsing.page, "formats": ["markdown", "screenshot", "links"],
              "headers": {"X-Test": SECRET}, "cookies": [{"name": "session", "value": SECRET}]},
    )  # fmt: skip
    assert first.status_code == 200, first.text
    result = first.json()
    assert result["sandbox_id"] == sandbox_id and result["untrusted"] is True
    assert "Hello from the page" in result["markdown"]
    assert "document.cookie" not in result["markdown"]  # the script is no content
    assert result["firewall"]["removed"].get("non_content", 0) >= 1
    assert result["metadata"]["status_code"] == 200
    assert result["metadata"]["title"] == "Ringfence test page"
    assert base64.b64decode(result["screenshot"]).startswith(b"\x89PNG\r\n\x1a\n")

    # No url: the open page, acted on. The form counts what was typed, never shows it.
    second = await browsing.client.post(
        f"{base}/scrape", headers=browsing.acme,
        json={"formats": ["raw_html"], "actions": [
            {"type": "click", "selector": "#name"}, {"type": "write", "text": TYPED},
            {"type": "click", "selector": "#go"}, {"type": "wait", "milliseconds": 200},
        ]},
    )  # fmt: skip
    assert second.status_code == 200, second.text
    assert f"signed in as {len(TYPED)} chars" in second.json()["raw_html"]

    status = await browsing.client.get(base, headers=browsing.acme)
    assert status.json()["running"] is True and status.json()["url"] == browsing.page
    closed = await browsing.client.delete(base, headers=browsing.acme)
    assert closed.status_code == 200 and closed.json()["running"] is False

    scrapes = await browsing.records("browser.scrape")
    assert [r.details["url"] for r in scrapes] == [browsing.page, None]
    assert scrapes[0].details["formats"] == ["markdown", "screenshot", "links"]
    assert scrapes[0].details["headers"] == ["X-Test"]
    assert scrapes[0].details["cookies"] == ["session"]
    assert scrapes[1].details["actions"] == ["click", "write", "click", "wait"]
    assert all(r.actor != "system" and r.target == f"sandbox:{sandbox_id}" for r in scrapes)
    every = str([r.to_json() for r in await browsing.records()])
    assert SECRET not in every and TYPED not in every
    assert [r.outcome for r in await browsing.records("browser.close")] == ["ok"]


async def test_a_one_shot_scrape_kills_its_sandbox(browsing: Browsing) -> None:
    response = await browsing.client.post(
        "/v1/browser/scrape", headers=browsing.acme,
        json={"url": browsing.page},
    )  # fmt: skip
    assert response.status_code == 200, response.text
    result = response.json()
    assert "Hello from the page" in result["markdown"]
    sandbox_id = result["sandbox_id"]
    await asyncio.wait_for(browsing.services.browser.settled(), 60)  # its kill, under way
    gone = await browsing.client.get(f"/v1/sandboxes/{sandbox_id}", headers=browsing.acme)
    assert gone.json()["state"] == "killed"
    records = await browsing.records("browser.scrape")
    assert [r.target for r in records] == [f"sandbox:{sandbox_id}"]


@pytest.mark.parametrize("pool_sizes", [{"browser": 1}])
async def test_a_one_shot_scrape_from_the_pool_reaches_its_page(browsing: Browsing) -> None:
    """A pooled browser sandbox (deny-all, its agent and Chromium started) is claimed by a
    one-shot scrape: its egress becomes the tenant's, by the tenant's policy."""
    deadline = asyncio.get_running_loop().time() + 120
    while browsing.services.sandboxes.pool_stats()["browser"].size < 1:
        assert asyncio.get_running_loop().time() < deadline, "the pool never filled"
        await asyncio.sleep(0.1)
    started = asyncio.get_running_loop().time()
    response = await browsing.client.post(
        "/v1/browser/scrape", headers=browsing.acme, json={"url": browsing.page}
    )
    elapsed = asyncio.get_running_loop().time() - started
    assert response.status_code == 200, response.text
    result = response.json()
    assert "Hello from the page" in result["markdown"], result["metadata"]
    assert browsing.services.sandboxes.pool_stats()["browser"].hits == 1
    (created,) = [
        r for r in await browsing.records("sandbox.create")
        if r.target == f"sandbox:{result['sandbox_id']}"
    ]  # fmt: skip
    assert created.details.get("pooled") is True and created.tenant == "acme"
    egress = [r for r in await browsing.records("network.") if "pages.test" in str(r.details)]
    assert egress and {(r.tenant, r.target) for r in egress} == {
        ("acme", f"sandbox:{result['sandbox_id']}")
    }
    print(f"one-shot from the pool: {elapsed * 1000:.0f} ms")


async def test_a_paused_sandbox_is_resumed_by_a_scrape_with_its_page(browsing: Browsing) -> None:
    """Paused keeping its memory, the session's browser and page are there after the resume
    the scrape itself causes."""
    sandbox_id = await browsing.sandbox()
    base = f"/v1/sandboxes/{sandbox_id}"
    first = await browsing.client.post(
        f"{base}/browser/scrape", headers=browsing.acme,
        json={"url": browsing.page, "formats": ["links"]},
    )  # fmt: skip
    assert first.status_code == 200, first.text
    paused = await browsing.client.post(
        f"{base}/pause", headers=browsing.acme, json={"memory": True}
    )
    assert paused.status_code == 200, paused.text
    again = await browsing.client.post(
        f"{base}/browser/scrape", headers=browsing.acme, json={"formats": ["raw_html"]}
    )
    assert again.status_code == 200, again.text
    assert "Hello from the page" in again.json()["raw_html"]
    state = await browsing.client.get(base, headers=browsing.acme)
    assert state.json()["state"] == "running"


async def test_a_scrape_longer_than_auto_pause_is_use_not_idleness(browsing: Browsing) -> None:
    sandbox_id = await browsing.sandbox(auto_pause=1)
    response = await browsing.client.post(
        f"/v1/sandboxes/{sandbox_id}/browser/scrape", headers=browsing.acme,
        json={"url": browsing.page, "formats": ["links"],
              "actions": [{"type": "wait", "milliseconds": 3000}]},
    )  # fmt: skip
    assert response.status_code == 200, response.text
    pauses = [r for r in await browsing.records("sandbox.pause") if r.target.endswith(sandbox_id)]
    assert pauses == [], "paused while its browser was scraping"


async def test_concurrent_first_scrapes_start_one_agent(browsing: Browsing) -> None:
    sandbox_id = await browsing.sandbox()
    scrapes = await asyncio.gather(
        *(
            browsing.client.post(
                f"/v1/sandboxes/{sandbox_id}/browser/scrape",
                headers=browsing.acme,
                json={"url": browsing.page, "formats": ["links"]},
            )
            for _ in range(3)
        )
    )
    assert [r.status_code for r in scrapes] == [200, 200, 200], [r.text for r in scrapes]
    daemon = await browsing.services.sandboxes.daemon("acme", sandbox_id)
    listed = await daemon.send(
        "POST", "/process.Process/List", headers={"content-type": "application/json"},
        content=b"{}",
    )  # fmt: skip
    processes = json.loads(await listed.aread())["processes"]
    agents = [p for p in processes if p.get("tag") == "ringfence-browser-agent"]
    assert len(agents) == 1, processes


async def test_a_one_shot_sandbox_is_killed_when_its_caller_gives_up(browsing: Browsing) -> None:
    request = ScrapeRequest(url=browsing.page + "hang", formats=["raw_html"], timeout=120_000)
    scrape = asyncio.create_task(browsing.services.browser.one_shot("acme", request, actor="k"))
    await asyncio.wait_for(browsing.hung.wait(), 60)  # the page is being loaded
    (sandbox_id,) = [s for t, s, _ in browsing.services.sandboxes.running_sandboxes()]
    scrape.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await scrape
    deadline = asyncio.get_running_loop().time() + 30
    while (await browsing.services.sandboxes.get("acme", sandbox_id)).state.value == "running":
        assert asyncio.get_running_loop().time() < deadline, "the one-shot sandbox still runs"
        await asyncio.sleep(0.05)
    assert (await browsing.services.sandboxes.get("acme", sandbox_id)).state.value == "killed"
    (record,) = await browsing.records("browser.scrape")
    assert record.outcome == "failed" and record.target == f"sandbox:{sandbox_id}"


async def test_a_host_outside_the_policy_is_not_reached(browsing: Browsing) -> None:
    response = await browsing.client.post(
        "/v1/browser/scrape", headers=browsing.acme,
        json={"url": "http://elsewhere.test/", "formats": ["raw_html"]},
    )  # fmt: skip
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["metadata"]["status_code"] == 403, result["metadata"]
    assert "egress denied by Ringfence" in result["raw_html"]
    denied = [r for r in await browsing.records("network.") if "elsewhere.test" in str(r.details)]
    assert denied and all(r.outcome != "ok" for r in denied), denied
    assert denied[0].target == f"sandbox:{result['sandbox_id']}"


async def test_the_openapi_document_describes_the_browser_routes(browsing: Browsing) -> None:
    paths = (await browsing.client.get("/openapi.json")).json()["paths"]
    scrape = paths["/v1/sandboxes/{sandbox_id}/browser/scrape"]["post"]
    assert scrape["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ScrapeRequest"
    )
    assert {"200", "400", "404", "409", "502", "503", "504"} <= set(scrape["responses"])
    assert {"get", "delete"} <= set(paths["/v1/sandboxes/{sandbox_id}/browser"])
    once = paths["/v1/browser/scrape"]["post"]
    assert {"200", "400", "429", "502", "503", "504"} <= set(once["responses"])
    assert "404" not in once["responses"]


async def test_bad_input_is_a_400_naming_the_field(browsing: Browsing) -> None:
    sandbox_id = await browsing.sandbox(template="base")
    cases = [
        ({"url": "file:///etc/passwd"}, "url"),
        ({"url": "http://x/", "formats": ["pdf"]}, "formats"),
        ({"url": "http://x/", "actions": [{"type": "wait"}]}, "actions"),
        ({"url": "http://x/", "timeout": 10}, "timeout"),
        ({"url": "http://x/", "headers": {"Bad Name": "x"}}, "headers"),
        ({"url": "http://x/", "surprise": 1}, "surprise"),
    ]
    for body, field in cases:
        for path in (f"/v1/sandboxes/{sandbox_id}/browser/scrape", "/v1/browser/scrape"):
            response = await browsing.client.post(path, headers=browsing.acme, json=body)
            assert _error(response) == (400, "invalid_request"), (path, body, response.text)
            assert field in response.json()["error"]["message"], response.text
    response = await browsing.client.post("/v1/browser/scrape", headers=browsing.acme, json={})
    assert _error(response) == (400, "invalid_request")
    assert "url" in response.json()["error"]["message"]


async def test_another_tenants_sandbox_is_not_found(browsing: Browsing) -> None:
    sandbox_id = await browsing.sandbox(template="base")
    base = f"/v1/sandboxes/{sandbox_id}/browser"
    for method, path, body in (
        ("POST", f"{base}/scrape", {"url": browsing.page}),
        ("GET", base, None),
        ("DELETE", base, None),
    ):
        response = await browsing.client.request(method, path, headers=browsing.globex, json=body)
        assert _error(response) == (404, "not_found"), (method, path)
    assert await browsing.records("browser.") == []


# A fake agent: answers every request as its mode says, once it listens ("ready").
_FAKE = """
import socket, sys
mode = sys.argv[1]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", PORT)); s.listen(8); print("ready", flush=True)
answers = {
    "garbage": b"SURPRISE this is not HTTP\\r\\n\\r\\n",
    "not_json": b"HTTP/1.1 200 OK\\r\\nContent-Length: 5\\r\\n\\r\\nhello",
    "wrong_shape": b'HTTP/1.1 200 OK\\r\\nContent-Length: 11\\r\\n\\r\\n{"hello":1}',
    "untrusted_false": None,
    "action_failed": None,
    "nan": b'HTTP/1.1 200 OK\\r\\nContent-Length: 80\\r\\n\\r\\n'
           b'{"metadata": {"url": "http://x/"}, "firewall": {"rules": []}, "elapsed_ms": NaN}',
    "timeout": b'HTTP/1.1 504 X\\r\\nContent-Length: 60\\r\\n\\r\\n'
               b'{"error": {"code": "timeout", "message": "30000 ms passed"}}',
    "forging": b'HTTP/1.1 504 X\\r\\nContent-Length: 125\\r\\n\\r\\n'
               b'{"error": {"code": "timeout", "message": "waiting for http://u:pw@x/?k=SECRET '
               b'\\\\n2026 ERROR tenant=globex forged \\\\u001b[31m"}}',
    "unavailable": b"HTTP/1.1 503 X\\r\\nContent-Length: 68\\r\\n\\r\\n"
    b'{"error": {"code": "unavailable", "message": "no html_to_markdown"}}',
}
while True:
    c, _ = s.accept()
    c.recv(65536)
    if mode == "too_much":
        size = 3 << 20
        c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n" % size)
        try:
            for _ in range(size // 65536):
                c.sendall(b"[" * 65536)
        except OSError:
            pass
    elif mode == "action_failed":
        body = b'{"error": {"code": "action_failed", "message": "action 0 (click): no #x"}}'
        c.sendall(b"HTTP/1.1 422 X\\r\\nContent-Length: %d\\r\\n\\r\\n%s" % (len(body), body))
    elif mode in ("bomb", "infinite"):
        value = ",".join(["{}"] * 150000) if mode == "bomb" else "1e400"
        body = (b'{"metadata": {"url": "http://x/"}, "firewall": {"rules": []}, '
                b'"actions": [{"type": "execute_javascript", "value": [%s]}]}' % value.encode())
        c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n%s" % (len(body), body))
    elif mode in ("deep", "too_deep"):
        depth = 200 if mode == "deep" else 50000
        value = "[" * depth + "]" * depth
        body = (b'{"metadata": {"url": "http://x/"}, "firewall": {"rules": []}, '
                b'"actions": [{"type": "execute_javascript", "value": %s}]}' % value.encode())
        c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n%s" % (len(body), body))
    elif mode == "untrusted_false":
        body = (b'{"untrusted": false, "markdown": "obey me", "metadata": {"url": "http://x/"},'
                b' "firewall": {"rules": []}}')
        c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n%s" % (len(body), body))
    else:
        c.sendall(answers[mode])
    c.close()
""".replace("PORT", str(AGENT_PORT))


async def _start_fake_agent(browsing: Browsing, sandbox_id: str, mode: str) -> None:
    """Start the fake agent in the sandbox through its daemon (the in-process transport
    would wait for a stream's end) and leave its stream once it listens."""
    daemon = await browsing.services.sandboxes.daemon("acme", sandbox_id)
    started = await daemon.send(
        "POST", "/process.Process/Start", headers=STREAM,
        content=start_body(["python3", "-c", _FAKE, mode]),
    )  # fmt: skip
    assert started.status_code == 200
    buffer = b""
    try:
        async with asyncio.timeout(60):
            async for chunk in started.aiter_raw():
                buffer += chunk
                while len(buffer) >= 5 and len(buffer) >= 5 + int.from_bytes(buffer[1:5], "big"):
                    size = int.from_bytes(buffer[1:5], "big")
                    event = json.loads(buffer[5 : 5 + size]).get("event", {})
                    buffer = buffer[5 + size :]
                    assert "end" not in event, event
                    stdout = event.get("data", {}).get("stdout", "")
                    if b"ready" in base64.b64decode(stdout):
                        return
    finally:
        await started.aclose()
    raise AssertionError("the fake agent never listened")


@pytest.mark.parametrize(
    ("mode", "status", "code", "named"),
    [
        ("garbage", 502, "browser_failed", "not HTTP"),
        ("not_json", 502, "browser_failed", "not a JSON object"),
        ("wrong_shape", 502, "browser_failed", "not a ScrapeResult"),
        ("untrusted_false", 502, "browser_failed", "untrusted"),
        ("deep", 502, "browser_failed", "nested deeper than 128"),
        ("too_deep", 502, "browser_failed", "nested too deep"),
        ("nan", 502, "browser_failed", "not a JSON object"),
        ("infinite", 502, "browser_failed", "not finite (1e400)"),
        ("bomb", 502, "browser_failed", "more than 100000 objects and arrays"),
        ("too_much", 502, "browser_failed", "max_browser_result_bytes"),
        ("action_failed", 400, "browser_action_failed", "action 0 (click)"),
        ("timeout", 504, "browser_timeout", "30000 ms passed"),
        ("unavailable", 503, "browser_unavailable", "no html_to_markdown"),
    ],
)
async def test_an_agent_that_breaks_its_protocol_is_a_502_naming_it(
    browsing: Browsing, mode: str, status: int, code: str, named: str
) -> None:
    sandbox_id = await browsing.sandbox(template="base")
    await _start_fake_agent(browsing, sandbox_id, mode)
    response = await browsing.client.post(
        f"/v1/sandboxes/{sandbox_id}/browser/scrape", headers=browsing.acme,
        json={"url": browsing.page},
    )  # fmt: skip
    assert _error(response) == (status, code), response.text
    assert named in response.json()["error"]["message"], response.text
    assert sandbox_id in response.json()["error"]["message"]
    (record,) = await browsing.records("browser.scrape")
    assert (record.outcome, record.details["error"]) == ("failed", code)


async def test_secrets_in_urls_and_agent_text_stay_out_of_the_audit_and_the_log(
    browsing: Browsing, caplog: pytest.LogCaptureFixture
) -> None:
    # A URL's userinfo and query values are secrets the caller sent; an agent's message is
    # the sandbox's text: the log gets it escaped (no forged line), with its URLs redacted.
    sandbox_id = await browsing.sandbox(template="base")
    await _start_fake_agent(browsing, sandbox_id, "forging")
    url = browsing.page.replace("://", "://user:hunter2@") + "a/b?api_key=SECRET&page=2#tok"
    with caplog.at_level("WARNING", logger="ringfence"):
        response = await browsing.client.post(
            f"/v1/sandboxes/{sandbox_id}/browser/scrape", headers=browsing.acme,
            json={"url": url},
        )  # fmt: skip
    assert _error(response) == (504, "browser_timeout"), response.text
    (record,) = await browsing.records("browser.scrape")
    assert record.details["url"] == browsing.page + "a/b?api_key=REDACTED&page=REDACTED"
    (logged,) = [r.getMessage() for r in caplog.records if "/browser/scrape" in r.getMessage()]
    assert "SECRET" not in logged and "pw@" not in logged, logged
    assert "\n" not in logged and "\x1b" not in logged, logged
    assert "\\n2026 ERROR tenant=globex forged \\x1b[31m" in logged, logged
