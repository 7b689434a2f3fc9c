"""The approval console against a real server over HTTP (SQLite and PostgreSQL), driven
with httpx and with Debian's headless Chromium through Playwright. ``ask_console`` is such a
server whose sandboxes have egress (the test origins and names of tests/network) and whose
egress asks go to a real webhook receiver."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ringfence.audit.signing import SealKey
from ringfence.config import Config
from ringfence.models import Role
from ringfence.service.audit import AuditLog
from ringfence.service.keys import mint_key
from ringfence.service.webhooks import WebhookNotifier
from ringfence.store.sql import SqlStore
from tests.integration._attack_helpers import eventually
from tests.network.conftest import Origin, gateway, http_origin
from tests.server._envd import run as run_command
from tests.server.conftest import Api, _uvicorn, live, postgres_database, sqlite_database
from tests.server.test_webhooks import SECRET, Receiver, receiver

__all__ = [
    "AskConsole",
    "Console",
    "gateway",
    "http_origin",
    "live",
    "postgres_database",
    "receiver",
    "sqlite_database",
]

CHROMIUM = "/usr/bin/chromium"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Console:
    """A live server, its agent key (``api.acme``), and two approver keys of tenant acme."""

    api: Api
    url: str
    approver: str
    second_approver: str

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        """A fresh browser-like client of the console (its own cookies, no redirects)."""
        return httpx.AsyncClient(base_url=self.url, timeout=30, **kwargs)

    async def propose(self, headers: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
        spec = {
            "request": {"command": ["sh", "-c", "echo remediated"], "timeout": 30},
            "rationale": "the cache filled the disk",
            **body,
        }
        response = await self.api.client.post(
            "/v1/proposals", headers=headers or self.api.acme, json=spec
        )
        assert response.status_code == 201, response.text
        proposal: dict[str, Any] = response.json()
        return proposal

    async def proposal(self, proposal_id: str) -> dict[str, Any]:
        response = await self.api.client.get(f"/v1/proposals/{proposal_id}", headers=self.api.acme)
        assert response.status_code == 200, response.text
        proposal: dict[str, Any] = response.json()
        return proposal

    async def finished(self, proposal_id: str) -> dict[str, Any]:
        for _ in range(600):
            proposal = await self.proposal(proposal_id)
            if proposal["state"] in ("succeeded", "failed"):
                return proposal
            await asyncio.sleep(0.05)
        raise AssertionError(f"proposal {proposal_id} never finished")


@pytest.fixture
async def console(live: Api) -> Console:
    approver = await mint_key(live.store, "acme", Role.APPROVER, "console test")
    second = await mint_key(live.store, "acme", Role.APPROVER, "console test, second")
    return Console(live, str(live.client.base_url).rstrip("/"), approver, second)


@dataclass
class AskConsole:
    """A live server with egress (``ask.test`` and the other test names resolve to the
    ``http_origin`` on loopback), the console, and a webhook receiver. Tenant acme has an
    agent key, two approver keys and an admin key; tenant globex an approver key."""

    url: str
    api: httpx.AsyncClient
    audit: AuditLog
    agent: str
    approver: str
    second_approver: str
    admin: str
    globex_approver: str
    origin: Origin
    webhooks: Receiver

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        """A fresh browser-like client of the console (its own cookies, no redirects)."""
        return httpx.AsyncClient(base_url=self.url, timeout=30, **kwargs)

    async def sandbox(self, key: str, *hosts: str) -> str:
        """A sandbox created with ``key`` whose policy asks about ``hosts`` (the origin's
        port); its id."""
        rules = [
            {"domain": h, "cidr": "127.0.0.1/32", "ports": [self.origin.port], "action": "ask"}
            for h in hosts
        ]
        response = await self.api.post(
            "/v1/sandboxes", json={"network": {"rules": rules}}, headers=_bearer(key)
        )
        assert response.status_code == 201, response.text
        sandbox_id: str = response.json()["id"]
        return sandbox_id

    def fetch(self, key: str, sandbox_id: str, host: str) -> asyncio.Task[str]:
        """curl, inside the sandbox, of the origin under ``host``, started now: what it
        printed (the body, or its error) once it ends."""

        async def curl() -> str:
            url = f"http://{host}:{self.origin.port}/"
            ran = await run_command(
                self.api, _bearer(key), sandbox_id,
                ["sh", "-c", f"curl -sS -m 60 -f {url} 2>&1; true"],
            )  # fmt: skip
            return ran.stdout

        return asyncio.create_task(curl())

    async def pending_ask(self, host: str) -> dict[str, Any]:
        """The pending ask (as the API lists it) for ``host``, once it is open."""

        async def found() -> dict[str, Any] | None:
            listed = await self.api.get(
                "/v1/network/asks", params={"pending": "true"}, headers=_bearer(self.admin)
            )
            assert listed.status_code == 200, listed.text
            return next((a for a in listed.json() if a["host"] == host), None)

        ask: dict[str, Any] = await eventually(found, timeout=30, what=f"an ask for {host}")
        return ask

    async def ask(self, ask_id: str) -> dict[str, Any]:
        listed = await self.api.get("/v1/network/asks", headers=_bearer(self.admin))
        ask: dict[str, Any] = next(a for a in listed.json() if a["id"] == ask_id)
        return ask


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(params=["sqlite", "postgres"])
async def ask_console(
    request: pytest.FixtureRequest,
    local_host: object,
    gateway: object,
    http_origin: Origin,
    receiver: Receiver,
) -> AsyncIterator[AskConsole]:
    from ringfence.backends.local import LocalExecutor
    from ringfence.backends.local.probe import Host
    from ringfence.compose import build_services
    from ringfence.network import EgressGateway
    from ringfence.server import create_app
    from ringfence.service.credentials import CredentialKey

    assert isinstance(local_host, Host) and isinstance(gateway, EgressGateway)
    # The test origins are on the host's loopback: the operator lets tenants name it here.
    config = Config(pool_sizes={}, network_internal_cidrs=["127.0.0.1/32"])
    store = await SqlStore.open(request.getfixturevalue(f"{request.param}_database"))
    notifier = WebhookNotifier([receiver.url], SECRET, first_backoff=0.05)
    # Egress asks go to the notifier, as `ringfence serve` wires them.
    services = await build_services(
        config, store=store, executor=LocalExecutor(config, host=local_host, egress=gateway),
        seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
        notifier=notifier,
    )  # fmt: skip
    audit = services.audit
    app = create_app(services)
    keys = [
        await mint_key(store, "acme", Role.AGENT),
        await mint_key(store, "acme", Role.APPROVER, "console test"),
        await mint_key(store, "acme", Role.APPROVER, "console test, second"),
        await mint_key(store, "acme", Role.ADMIN),
        await mint_key(store, "globex", Role.APPROVER),
    ]
    # The app's lifespan runs in a task of its own: entered and left in the same task,
    # whichever tasks pytest runs the fixture's setup and teardown in.
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with app.router.lifespan_context(app), _uvicorn(app) as url:
            ready.set_result(url)
            await stop.wait()

    server = asyncio.create_task(serve())
    try:
        url = await asyncio.wait_for(asyncio.shield(ready), 30)
        async with httpx.AsyncClient(base_url=url, timeout=90) as api:
            yield AskConsole(url, api, audit, *keys, http_origin, receiver)
    finally:
        stop.set()
        await server
        await notifier.aclose()
        await store.aclose()


def csrf_of(html: str) -> str:
    """The CSRF token in a page's forms."""
    found = _CSRF.search(html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, key: str) -> httpx.Response:
    """Sign in as a browser would: read the form, post it back with its token."""
    form = await client.get("/console/login")
    assert form.status_code == 200, form.text
    return await client.post(
        "/console/login", data={"key": key, "csrf": csrf_of(form.text)}, follow_redirects=False
    )


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    """Debian's Chromium, headless, through Playwright (whose own browsers are never
    downloaded: ``executable_path`` points at the system one)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup (it installs chromium)")
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        # As root, Chromium refuses to start with its sandbox on. Turning it off is acceptable
        # here: the browser opens only pages that this test's own loopback server renders
        # from data the test wrote, never the web, and it lives for one test.
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox"] if os.geteuid() == 0 else [],
        )
        try:
            yield browser
        finally:
            await browser.close()
