"""A kill after a resume from disk that failed (issue 18, difference 13's "kill during a
resume"): the failed start is killed and its entry left ending as paused; the kill that
waited for the resume must still answer killed, and take the paused files with it."""

from __future__ import annotations

import pytest

from ringfence.errors import SandboxNotRunning
from ringfence.service.daemon_client import DaemonClient
from tests.server.conftest import Api

pytestmark = pytest.mark.integration


async def test_a_kill_after_a_failed_resume_answers_killed_and_removes_its_files(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json={}, timeout=60)
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    base = f"/v1/sandboxes/{sandbox_id}"
    paused = await api.client.post(f"{base}/pause", headers=api.acme, json={"memory": False})
    assert paused.status_code == 200, paused.text
    saved = api.services.sandboxes.files.paused_export(sandbox_id).parent
    assert saved.is_dir(), "paused to disk: its files are kept"

    async def unreachable(self: DaemonClient, seconds: float) -> None:
        raise SandboxNotRunning("its daemon cannot be reached")

    monkeypatch.setattr(DaemonClient, "health", unreachable)
    resumed = await api.client.post(f"{base}/resume", headers=api.acme, timeout=60)
    assert resumed.status_code >= 500, resumed.text  # it stays paused: retry
    monkeypatch.undo()
    killed = await api.client.delete(base, headers=api.acme, timeout=60)
    assert killed.status_code == 200, killed.text
    assert killed.json()["state"] == "killed", killed.json()
    assert not saved.exists(), "a killed sandbox's paused files are removed"
