"""``ringfence mcp``: the MCP server over stdio, for desktop agents (see docs/mcp.md)."""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

import click

from ringfence.cli._common import fail
from ringfence.cli.sandbox import api_options

__all__ = ["mcp"]

EXIT_USAGE = 2


@click.command()
@api_options
def mcp(url: str | None, api_key: str | None) -> None:
    """Serve the Model Context Protocol on stdin/stdout.

    An MCP client (Claude Desktop, an IDE, an agent framework) starts this command; its tools
    create and drive sandboxes and propose remediations on the Ringfence server at --url,
    with your key. Logs go to stderr. Streamable HTTP needs no command: `ringfence serve`
    serves it at /mcp.
    """
    import anyio

    from ringfence.client.lowlevel import DEFAULT_URL
    from ringfence.mcp.server import run_stdio

    if not api_key:
        fail("no API key: pass --api-key or set RINGFENCE_API_KEY", EXIT_USAGE)
    server = url or DEFAULT_URL
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        fail(f"--url {server!r}: give the server as http://host:port", EXIT_USAGE)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run_stdio, server, api_key)
