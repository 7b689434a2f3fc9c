from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.server.conftest import api, postgres_database, sqlite_database, store
from tests.server.test_serve_process import RINGFENCE, Server

__all__ = ["LiveServer", "api", "live", "postgres_database", "sqlite_database", "store"]


@dataclass(frozen=True)
class LiveServer:
    """``ringfence serve`` on a loopback port, with keys of two tenants."""

    url: str
    key: str  # tenant default's admin key
    other_key: str  # tenant globex's agent key
    data_dir: Path


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real server for the whole client suite (sandboxes are cheap; a server is not)."""
    server = Server(tmp_path_factory.mktemp("live") / "data", None)
    server.start()
    try:
        other = subprocess.run(
            [RINGFENCE, "keys", "create", "--tenant", "globex", *server.args()],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        key = (server.data_dir / "admin-key").read_text().strip()
        yield LiveServer(server.url, key, other.stdout.strip(), server.data_dir)
    finally:
        server.stop()
