"""The official E2B SDKs (``e2b``, ``e2b-code-interpreter``), unmodified, against a real
``ringfence serve`` on loopback: only ``E2B_API_URL``, ``E2B_SANDBOX_URL``,
``E2B_VOLUME_API_URL`` and ``E2B_API_KEY`` point them at it.

The server is shared by every test of a worker, so a failing test's report carries what the
server printed while it ran (its last ``_LOG_LINES`` lines): a failure that shows only on a
loaded machine is diagnosable from the run that saw it."""

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

_LOG_LINES = 200  # of the server's output, in a failing test's report
_SERVER = pytest.StashKey[Server]()  # the session's server (config's stash)
_SINCE = pytest.StashKey[int]()  # how many lines it had printed when the test began (item's)


@pytest.fixture(scope="session")
def e2b_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """One server for the suite, and the SDKs' environment pointing at it (tenant
    ``default``'s admin key; ``other_key`` is tenant globex's)."""
    saved = {name: os.environ.get(name) for name in _VARIABLES}
    server = Server(tmp_path_factory.mktemp("e2b") / "data", None)
    request.config.stash[_SERVER] = server
    for live in _serving(server):
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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    server = item.config.stash.get(_SERVER, None)
    item.stash[_SINCE] = len(server.lines) if server is not None else 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test of the server's (setup, call or teardown) gets the server's output
    since the test began, its last ``_LOG_LINES`` lines, as a section of its report."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    server = item.config.stash.get(_SERVER, None)
    if not report.failed or server is None or "e2b_server" not in item.fixturenames:
        return
    printed = server.lines[item.stash.get(_SINCE, 0) :]
    shown = f"its last {_LOG_LINES} lines" if len(printed) > _LOG_LINES else "all of it"
    tail = "".join(printed[-_LOG_LINES:]) or "(nothing)\n"
    report.sections.append((f"ringfence serve output during the test ({shown})", tail))


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
