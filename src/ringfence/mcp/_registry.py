"""Registering a tool: its docstring, as one paragraph, is its description."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

__all__ = ["add_tool"]


def add_tool(
    server: MCPServer, fn: Callable[..., Any], title: str, annotations: ToolAnnotations
) -> None:
    """Raises ``ValueError`` for a tool without a docstring: its description is the model's
    only guide to it."""
    if not fn.__doc__:
        raise ValueError(f"tool {fn.__name__} has no description")
    description = " ".join(fn.__doc__.split())
    server.add_tool(fn, title=title, description=description, annotations=annotations)
