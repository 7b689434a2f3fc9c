"""A kill right after a create served from the warm pool (issue 18, difference 13): the
claim's record and the daemon's ``/init`` are still in flight when the create is answered,
and a kill landing then must answer killed (the SDK's ``True``, the native DELETE's
``killed``), never the failure of the step it interrupted. So must a kill sent while a
pause or a resume is under way."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from e2b import Sandbox, SandboxNotFoundException
from tests.e2b.conftest import E2bServer

# Each try claims from the pool: the race showed on main within a few.
_TRIES = 12
_READY = 'ringfence_pool_ready{template="base"}'
_HITS = 'ringfence_pool_hits_total{template="base"}'


def _metrics(server: E2bServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/v1/metrics", timeout=10).text
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def _pool_ready(server: E2bServer) -> float:
    """The pool's hits so far, once it has a sandbox ready (polled, bounded)."""
    deadline = time.monotonic() + 60
    while (metrics := _metrics(server)).get(_READY, 0) < 1:
        assert time.monotonic() < deadline, "the pool did not refill within 60 s"
        time.sleep(0.02)
    return metrics.get(_HITS, 0)


def test_a_kill_right_after_a_pooled_create_answers_killed(e2b_server: E2bServer) -> None:
    for attempt in range(_TRIES):
        hits = _pool_ready(e2b_server)
        sbx = Sandbox.create(timeout=60)
        assert sbx.kill(), f"try {attempt}: the kill of a just-claimed sandbox returned False"
        assert _metrics(e2b_server)[_HITS] > hits, "the create was not served from the pool"
        assert not sbx.is_running()


def test_a_native_delete_right_after_a_pooled_create_answers_killed(
    e2b_server: E2bServer,
) -> None:
    headers = {"Authorization": f"Bearer {e2b_server.key}"}
    with httpx.Client(base_url=e2b_server.url, headers=headers, timeout=60) as http:
        for attempt in range(_TRIES):
            hits = _pool_ready(e2b_server)
            created = http.post("/v1/sandboxes", json={"template": "base", "timeout": 60})
            assert created.status_code == 201, created.text
            killed = http.delete(f"/v1/sandboxes/{created.json()['id']}")
            assert killed.status_code == 200, killed.text
            assert killed.json()["state"] == "killed", f"try {attempt}: {killed.json()}"
            assert _metrics(e2b_server)[_HITS] > hits, "the create was not served from the pool"


def _gone(sbx: Sandbox) -> None:
    """Nothing of it is left: not listed (running or paused), not resumable."""
    assert sbx.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id)


@pytest.mark.parametrize("mode", ["full", "filesystem"])
def test_a_kill_during_a_pause_answers_killed(e2b_server: E2bServer, mode: str) -> None:
    """Sent together, the kill lands before, during or after the pause; it waits for a
    pause under way, and answers killed whichever it was."""
    for attempt in range(3):
        sbx = Sandbox.create(timeout=60)
        sbx.files.write("/home/user/kept.txt", "x" * 1_000_000)  # a save that takes a while
        with ThreadPoolExecutor(1) as pool:
            pausing = pool.submit(sbx.pause, mode=mode)
            assert sbx.kill(), f"try {attempt}: a kill during a pause returned False"
            refused = pausing.exception(60)  # paused first, or found gone: either is right
            assert refused is None or isinstance(refused, SandboxNotFoundException), refused
        _gone(sbx)


@pytest.mark.parametrize("mode", ["full", "filesystem"])
def test_a_kill_during_a_resume_answers_killed(e2b_server: E2bServer, mode: str) -> None:
    for attempt in range(3):
        sbx = Sandbox.create(timeout=60)
        assert sbx.pause(mode=mode) is True
        with ThreadPoolExecutor(1) as pool:
            resuming = pool.submit(Sandbox.connect, sbx.sandbox_id)
            assert sbx.kill(), f"try {attempt}: a kill during a resume returned False"
            refused = resuming.exception(60)
            assert refused is None or isinstance(refused, SandboxNotFoundException), refused
        _gone(sbx)
