"""MCP clients of a real ``ringfence serve``: the official SDK's ``Client``, over stdio (a
``ringfence mcp`` process) and over streamable HTTP (the server's ``/mcp``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import httpx2
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from tests.client.conftest import LiveServer, live, postgres_database, sqlite_database
from tests.server.test_serve_process import RINGFENCE

__all__ = [
    "Connect", "LiveServer", "Transport", "live", "postgres_database", "sqlite_database",
    "structured", "tool_error",
]  # fmt: skip

Transport = Literal["stdio", "http"]
Connect = Callable[[str], contextlib.AbstractAsyncContextManager[Client]]


@contextlib.asynccontextmanager
async def connected(live: LiveServer, transport: Transport, key: str) -> AsyncIterator[Client]:
    """An MCP client of ``live`` with ``key``, over ``transport``."""
    if transport == "stdio":
        params = StdioServerParameters(
            command=RINGFENCE, args=["mcp"],
            env={"RINGFENCE_URL": live.url, "RINGFENCE_API_KEY": key},
        )  # fmt: skip
        async with Client(params, read_timeout_seconds=120) as client:
            yield client
        return
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120) as http,
        Client(
            streamable_http_client(f"{live.url}/mcp", http_client=http), read_timeout_seconds=120
        ) as client,
    ):
        yield client


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> Transport:
    value: Transport = request.param
    return value


@pytest.fixture
def connect(live: LiveServer, transport: Transport) -> Connect:
    """``async with connect(key) as client``: a client over this test's transport."""
    return lambda key: connected(live, transport, key)


def structured(result: CallToolResult) -> dict[str, Any]:
    """A successful call's structured result (also checked against its text form)."""
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    text = result.content[0]
    assert text.type == "text" and json.loads(text.text) == result.structured_content
    return result.structured_content


def tool_error(result: CallToolResult) -> str:
    """A failed call's message: an MCP tool error (isError), never a protocol error."""
    assert result.is_error, result.structured_content
    text = result.content[0]
    assert text.type == "text"
    return text.text
