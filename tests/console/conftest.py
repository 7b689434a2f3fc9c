"""The approval console against a real server over HTTP (SQLite and PostgreSQL), driven
with httpx and with Debian's headless Chromium through Playwright."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ringfence.service.keys import mint_key
from ringfence.store import Role
from tests.server.conftest import Api, live, postgres_database, sqlite_database

__all__ = ["Console", "live", "postgres_database", "sqlite_database"]

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
