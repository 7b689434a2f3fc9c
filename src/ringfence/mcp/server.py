"""The Ringfence MCP server: its tools, a resource and a prompt, over a ``Connector``.

``build_server`` makes the server; the transport decides the connector (see ``_connect``):
``run_stdio`` for ``ringfence mcp``, ``McpEndpoint`` (``ringfence.mcp.http``) in
``ringfence serve``.
"""

from __future__ import annotations

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError

from ringfence import __version__
from ringfence.mcp._bounds import clip
from ringfence.mcp._browser_tools import BrowserTools
from ringfence.mcp._connect import Connector, RemoteConnector, session
from ringfence.mcp._file_tools import FileTools
from ringfence.mcp._remediation_tools import RemediationTools
from ringfence.mcp._sandbox_tools import SandboxTools
from ringfence.mcp._state_tools import StateTools
from ringfence.mcp.guide import GUIDE, INSTRUCTIONS

__all__ = ["build_server", "run_stdio"]

TREE_DEPTH = 3
TREE_CHARS = 20_000


def build_server(connector: Connector) -> MCPServer:
    """A server whose every tool reaches Ringfence through ``connector``."""
    server: MCPServer = MCPServer(
        "ringfence", title="Ringfence", version=__version__, instructions=INSTRUCTIONS,
        log_level="WARNING",
    )  # fmt: skip
    SandboxTools(connector).register(server)
    StateTools(connector).register(server)
    FileTools(connector).register(server)
    RemediationTools(connector).register(server)
    BrowserTools(connector).register(server)

    @server.resource(
        "ringfence://sandboxes/{sandbox_id}/files",
        name="sandbox_files",
        title="A sandbox's files",
        description=f"The files under /home/user in a sandbox, {TREE_DEPTH} levels deep, "
        "one path per line (directories end with /).",
        mime_type="text/plain",
    )
    async def sandbox_files(sandbox_id: str, ctx: Context) -> str:
        try:
            async with session(connector, ctx) as rf:
                sandbox = await rf.running(sandbox_id)
                entries = await sandbox.files.list("/home/user", TREE_DEPTH)
        except ToolError as exc:  # Ringfence's error, as the client expects it here
            raise ResourceError(str(exc)) from exc
        lines = sorted(e.path + ("/" if e.type == "dir" else "") for e in entries)
        return clip("\n".join(lines), TREE_CHARS)[0]

    @server.prompt(
        name="sandbox_guide",
        title="How to work in a Ringfence sandbox",
        description="What a Ringfence sandbox is, its limits, and how remediations are "
        "approved: a briefing for an agent about to use these tools.",
    )
    def sandbox_guide() -> str:
        return GUIDE

    return server


async def run_stdio(url: str, api_key: str) -> None:
    """Serve MCP on stdin/stdout, every call going to the server at ``url`` with
    ``api_key``, until stdin closes."""
    await build_server(RemoteConnector(url, api_key)).run_stdio_async()
