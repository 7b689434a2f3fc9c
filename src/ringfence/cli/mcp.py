"""``ringfence mcp``: the MCP server over stdio, for desktop agents (see docs/mcp.md)."""

from __future__ import annotations

import contextlib

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

    from ringfence.client._base import DEFAULT_URL
    from ringfence.mcp.server import run_stdio

    if not api_key:
        fail("no API key: pass --api-key or set RINGFENCE_API_KEY", EXIT_USAGE)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run_stdio, url or DEFAULT_URL, api_key)
