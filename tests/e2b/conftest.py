"""The official E2B SDKs (``e2b``, ``e2b-code-interpreter``), unmodified, against a real
``ringfence serve`` on loopback: only ``E2B_API_URL``, ``E2B_SANDBOX_URL``,
``E2B_VOLUME_API_URL`` and ``E2B_API_KEY`` point them at it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.client.conftest import LiveServer, _serving
from tests.server.test_serve_process import Server

__all__ = ["E2bServer", "audit_records"]

E2bServer = LiveServer


@pytest.fixture(scope="session")
def e2b_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server for the suite, and the SDKs' environment pointing at it (tenant
    ``default``'s admin key; ``other_key`` is tenant globex's)."""
    saved = {name: os.environ.get(name) for name in _VARIABLES}
    for live in _serving(Server(tmp_path_factory.mktemp("e2b") / "data", None)):
        os.environ.update(
            E2B_API_URL=live.url, E2B_SANDBOX_URL=live.url, E2B_VOLUME_API_URL=live.url,
            E2B_API_KEY=live.key,
        )  # fmt: skip
        os.environ.pop("E2B_DEBUG", None)
        os.environ.pop("E2B_DOMAIN", None)
        try:
            yield live
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


_VARIABLES = (
    "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL", "E2B_API_KEY", "E2B_DEBUG",
    "E2B_DOMAIN",
)  # fmt: skip


def audit_records(
    server: LiveServer, target: str, action: str, mentioning: str = ""
) -> list[dict[str, object]]:
    """The audit records of ``action`` on ``target``, polled until one mentions
    ``mentioning`` (records are written in batches) or 10 s have passed."""
    deadline = time.monotonic() + 10
    while True:
        records: list[dict[str, object]] = httpx.get(
            f"{server.url}/v1/audit",
            params={"target": target, "action": action},
            headers={"Authorization": f"Bearer {server.key}"},
        ).json()
        if any(mentioning in str(r) for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)
