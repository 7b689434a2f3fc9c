"""Code contexts in the daemon: a cell whose client goes away is interrupted, not left
running with its context held (an agent that gave up on a cell must not pay for it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from tests.sandboxd.conftest import Daemon, wait_for

TICKING = """
import pathlib, time
print('started', flush=True)
for i in range(100000):
    pathlib.Path({path!r}).write_text(str(i))
    time.sleep(0.02)
"""


def _ticks(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return -1


def _client(daemon: Daemon) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=daemon.path)
    return httpx.Client(transport=transport, base_url="http://sandbox", timeout=30)


def test_a_cell_whose_client_left_is_interrupted_and_its_context_kept(daemon: Daemon) -> None:
    context = daemon.client.post("/contexts", json={"language": "python"}).json()
    ticks = Path(daemon.home) / "ticks"
    cell = {"code": TICKING.format(path=str(ticks)), "context_id": context["id"]}
    assert daemon.client.post(
        "/execute", json={"code": "kept = 42", "context_id": context["id"]}
    ).is_success
    with _client(daemon) as leaving, leaving.stream("POST", "/execute", json=cell) as answer:
        lines = answer.iter_lines()  # kept: a dropped iterator closes the answer early
        first = json.loads(next(lines))
        assert first["type"] == "stdout" and first["text"].strip() == "started"
        wait_for(lambda: _ticks(ticks) > 2)
    # The client has gone away mid-cell: its connection is closed.

    def stopped() -> bool:
        before = _ticks(ticks)
        time.sleep(0.2)
        return _ticks(ticks) == before

    wait_for(stopped, timeout=5)
    started = time.monotonic()
    answer = daemon.client.post("/execute", json={"code": "kept", "context_id": context["id"]})
    messages = [json.loads(line) for line in answer.text.splitlines()]
    assert time.monotonic() - started < 5, "the context was free at once"
    results = [m for m in messages if m["type"] == "result"]
    assert results and results[0]["text"] == "42", messages  # interrupted, not restarted
