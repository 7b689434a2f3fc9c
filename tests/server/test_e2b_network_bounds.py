"""E2B's network options cannot make the server work for long (on the fakes): the review's
request (many addresses spread over one /32 allowed, the /32 denied) is answered at once,
a 404 for a sandbox the key cannot see (looked up before anything is mapped) and a 400 for
its own; the same options at create are a 400 as quickly. Each test has a short deadline,
so a mapping that would take minutes fails it instead of hanging the suite."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import Api

SPREAD = [f"2001:4860:{i:x}::1" for i in range(1, 257)]  # public, across one /32
ATTACK = {"allowOut": SPREAD, "denyOut": ["2001:4860::/32"]}


async def _timed_put(api: Api, sandbox_id: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = await api.client.put(
        f"/sandboxes/{sandbox_id}/network", headers={"X-API-KEY": api.acme_key}, json=ATTACK
    )
    return answer, time.monotonic() - started


@pytest.mark.fakes
@pytest.mark.timeout(30)
async def test_the_spread_holes_update_is_answered_at_once(api: Api) -> None:
    answer, took = await _timed_put(api, "no-such-sandbox")
    assert answer.status_code == 404, answer.text
    assert took < 2.0, took
    headers = {"X-API-KEY": api.acme_key}
    created = await api.client.post("/v2/sandboxes", headers=headers, json={"templateID": "base"})
    assert created.status_code == 201, created.text
    answer, took = await _timed_put(api, created.json()["sandboxID"])
    assert answer.status_code == 400, answer.text
    assert "at most 256" in answer.json()["message"]
    assert took < 2.0, took


@pytest.mark.fakes
@pytest.mark.timeout(30)
async def test_the_spread_holes_create_is_a_400_at_once(api: Api) -> None:
    started = time.monotonic()
    answer = await api.client.post(
        "/v2/sandboxes",
        headers={"X-API-KEY": api.acme_key},
        json={"templateID": "base", "network": ATTACK},
    )
    assert answer.status_code == 400, answer.text
    assert "at most 256" in answer.json()["message"]
    assert time.monotonic() - started < 2.0
