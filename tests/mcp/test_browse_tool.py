"""The browse tool's schema and refusals, through the official MCP client over both
transports, against a real server (its pages are tests/client/test_browser_live.py's)."""

from __future__ import annotations

import pytest

from tests.mcp.conftest import Connect, LiveServer, tool_error


async def test_the_browse_tool_describes_its_arguments_and_reads_the_open_world(
    live: LiveServer, connect: Connect
) -> None:
    async with connect(live.key) as client:
        (tool,) = [t for t in (await client.list_tools()).tools if t.name == "browse"]
    assert "untrusted-web-content" in (tool.description or "")
    properties = tool.input_schema["properties"]
    assert tool.input_schema.get("required", []) == [], "url or sandbox_id, checked by the tool"
    assert properties["timeout"]["maximum"] == 300
    assert properties["max_chars"]["maximum"] == 200_000
    assert set(properties["screenshot"]["enum"]) == {"none", "viewport", "full_page"}
    assert tool.annotations is not None and tool.annotations.open_world_hint is True
    assert tool.output_schema is not None
    assert {"content", "firewall", "untrusted"} <= set(tool.output_schema["properties"])


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ({}, "invalid_request"),  # neither a url nor a sandbox
        ({"url": "file:///etc/passwd"}, "invalid_request"),
        ({"url": "http://a.test/", "actions": [{"type": "click"}]}, ""),  # schema: no selector
        ({"url": "http://a.test/", "sandbox_id": "sb-does-not-exist"}, "not_found"),
    ],
)
async def test_bad_calls_are_tool_errors_naming_their_code(
    live: LiveServer, connect: Connect, arguments: dict[str, object], code: str
) -> None:
    async with connect(live.key) as client:
        message = tool_error(await client.call_tool("browse", arguments))
    assert f": {code}" in message if code else message, message
