"""``/mcp`` in ``ringfence serve``: authenticated exactly as the HTTP API, audited under the
caller's key, and never acting with anyone's key but the request's own."""

from __future__ import annotations

import asyncio

import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.mcp.conftest import Connect, LiveServer, structured, tool_error

_INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "test", "version": "1"}},
}  # fmt: skip
_MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer rf_0000000000000000_" + "x" * 43},
        {"Authorization": "Bearer not-a-key"},
        {"X-API-Key": "rf_0000000000000000_" + "x" * 43},
        {"Authorization": "Basic dXNlcjpwYXNz"},
    ],
)
def test_a_request_without_a_valid_key_is_refused_as_the_api_refuses_it(
    live: LiveServer, headers: dict[str, str]
) -> None:
    refused = httpx.post(f"{live.url}/mcp", json=_INITIALIZE, headers={**_MCP_HEADERS, **headers})
    api = httpx.get(f"{live.url}/v1/sandboxes", headers=headers)
    assert refused.status_code == api.status_code == 401
    assert refused.json() == api.json()
    assert refused.json()["error"]["code"] == "unauthenticated"
    assert refused.headers["www-authenticate"] == "Bearer"


def test_a_bad_bearer_key_is_not_rescued_by_a_good_x_api_key(live: LiveServer) -> None:
    """As in the HTTP API, the bearer key is the one that counts when both are sent."""
    headers = {"Authorization": "Bearer rf_0000000000000000_" + "x" * 43, "X-API-Key": live.key}
    refused = httpx.post(f"{live.url}/mcp", json=_INITIALIZE, headers={**_MCP_HEADERS, **headers})
    assert refused.status_code == httpx.get(f"{live.url}/v1/whoami", headers=headers).status_code
    assert refused.status_code == 401


async def test_an_x_api_key_header_works_as_in_the_api(live: LiveServer) -> None:
    async with (
        httpx2.AsyncClient(headers={"X-API-Key": live.other_key}, timeout=60) as http,
        Client(streamable_http_client(f"{live.url}/mcp", http_client=http)) as client,
    ):
        listed = structured(await client.call_tool("sandbox_list", {}))
    assert listed["truncated"] is False


async def test_concurrent_callers_each_act_with_their_own_key(live: LiveServer) -> None:
    """Calls of two tenants interleaved on one server: each sandbox is its creator's."""

    async def create_and_list(key: str, label: str) -> tuple[str, set[str]]:
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120) as http,
            Client(streamable_http_client(f"{live.url}/mcp", http_client=http)) as client,
        ):
            sid = structured(
                await client.call_tool("sandbox_create", {"metadata": {"race": label}})
            )["sandbox_id"]
            listed = structured(await client.call_tool("sandbox_list", {"limit": 100}))
            await client.call_tool("sandbox_kill", {"sandbox_id": sid})
            return sid, {s["sandbox_id"] for s in listed["sandboxes"]}

    results = await asyncio.gather(
        *(create_and_list(key, str(i)) for i, key in enumerate([live.key, live.other_key] * 3))
    )
    mine = {results[i][0] for i in range(0, 6, 2)}
    theirs = {results[i][0] for i in range(1, 6, 2)}
    for i, (_, seen) in enumerate(results):
        assert not seen & (theirs if i % 2 == 0 else mine), "a call saw the other tenant's"


@pytest.mark.every_store
async def test_the_audit_log_names_the_callers_key(live: LiveServer, connect: Connect) -> None:
    agent = live.mint_key("agent")
    async with connect(agent) as client:
        sid = structured(await client.call_tool("sandbox_create", {}))["sandbox_id"]
        structured(await client.call_tool("run_command", {"sandbox_id": sid, "command": "true"}))
        structured(await client.call_tool("sandbox_kill", {"sandbox_id": sid}))
        forbidden = tool_error(await client.call_tool("sandbox_get", {"sandbox_id": "sbnope"}))
        assert "not_found" in forbidden
    records = httpx.get(
        f"{live.url}/v1/audit",
        params={"target": f"sandbox:{sid}", "limit": 1000},
        headers={"Authorization": f"Bearer {live.key}"},
    ).json()
    actions = {(r["actor"], r["action"]) for r in records}
    key_id = agent.split("_")[1]
    assert {(key_id, "sandbox.create"), (key_id, "sandbox.kill")} <= actions, actions
    assert all(r["tenant"] == "default" for r in records)
