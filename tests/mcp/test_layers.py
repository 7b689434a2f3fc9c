"""What the MCP package may import: it is an entry point over the SDK."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ringfence

PACKAGE = Path(ringfence.__file__).parent / "mcp"


def _imports(module: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("ringfence")}


def test_the_tools_reach_ringfence_only_through_the_sdk() -> None:
    allowed = ("ringfence.client", "ringfence.errors", "ringfence.models", "ringfence.proposals")
    for module in PACKAGE.glob("*.py"):
        outside = {
            name for name in _imports(module)
            if not name.startswith(("ringfence.mcp", *allowed)) and name != "ringfence"
        }  # fmt: skip
        if module.name == "http.py":  # authenticates keys as the HTTP API does, and says so
            outside -= {"ringfence.service.keys", "ringfence.store", "ringfence.server.connections"}
        assert not outside, f"{module.name} imports {outside}"


def test_the_stdio_server_loads_no_server_store_or_backend() -> None:
    probe = (
        "import sys, ringfence.mcp.server; "
        "print(sorted(m for m in sys.modules if m.startswith(('ringfence.server', "
        "'ringfence.service', 'ringfence.store', 'ringfence.backends.local', 'sqlalchemy'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
