from __future__ import annotations

import contextlib
import json
import struct
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ringfence.client._base import Settings
from ringfence.client._link import Link
from tests.server.conftest import api, postgres_database, sqlite_database, store
from tests.server.test_serve_process import RINGFENCE, Server
from tests.store.conftest import new_postgres_database

__all__ = [
    "LiveServer", "api", "frame", "live", "mock_link", "postgres_database", "sqlite_database",
    "store",
]  # fmt: skip

# How the server marks an answer it passes through from the sandbox's daemon.
FROM_SANDBOX = {"ringfence-origin": "sandbox"}


@dataclass(frozen=True)
class LiveServer:
    """``ringfence serve`` on a loopback port, with keys of two tenants."""

    url: str
    key: str  # tenant default's admin key
    other_key: str  # tenant globex's agent key
    data_dir: Path
    database_url: str | None = None  # None: the store is SQLite in data_dir

    def store_args(self) -> list[str]:
        """Where its store is, as ``ringfence keys create`` takes it."""
        extra = ["--database-url", self.database_url] if self.database_url else []
        return ["--data-dir", str(self.data_dir), *extra]

    def mint_key(self, role: str, tenant: str = "default") -> str:
        """A new key of ``role`` (agent, approver, admin) in ``tenant``."""
        done = subprocess.run(
            [RINGFENCE, "keys", "create", "--tenant", tenant, "--role", role, *self.store_args()],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout.strip()


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """One real server per store for the whole client suite (sandboxes are cheap; a server
    is not): on SQLite in its data directory, then on a fresh PostgreSQL database."""
    with contextlib.ExitStack() as stack:
        url = None
        if request.param == "postgres":
            url = stack.enter_context(new_postgres_database())
        yield from _serving(Server(tmp_path_factory.mktemp("live") / "data", url))


def _serving(server: Server) -> Iterator[LiveServer]:
    server.start()
    try:
        other = subprocess.run(
            [RINGFENCE, "keys", "create", "--tenant", "globex", *server.args()],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        key = (server.data_dir / "admin-key").read_text().strip()
        yield LiveServer(
            server.url, key, other.stdout.strip(), server.data_dir, server.database_url
        )
    finally:
        server.stop()


def mock_link(handler: Callable[[httpx.Request], httpx.Response]) -> Link:
    """A link whose server is ``handler``: to give the SDK answers a real sandbox would not."""
    settings = Settings("http://ringfence.test", "key", 10.0)
    http = httpx.AsyncClient(base_url=settings.url, transport=httpx.MockTransport(handler))
    return Link(settings, "sbx", http)


def frame(message: object, flags: int = 0) -> bytes:
    """One Connect envelope of a streamed answer (flags 2: the end-stream frame)."""
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload
