"""The service layer: what entry points (HTTP, CLI, later MCP) call, and nothing below it."""
