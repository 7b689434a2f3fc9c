"""The E2B door's answers for what the native service refuses (on the fakes): a backend
that cannot capture state is E2B's 400 (its 409 would tell the SDK "already paused"), and a
fork that could not start all its children answers each entry with why, as E2B's per-fork
errors do."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from ringfence.errors import SandboxError, StateUnsupported, TooManyRequests
from tests.server.conftest import Api


async def _e2b_sandbox(api: Api) -> tuple[str, dict[str, str]]:
    headers = {"X-API-KEY": api.acme_key}
    created = await api.client.post("/v2/sandboxes", headers=headers, json={"templateID": "base"})
    assert created.status_code == 201, created.text
    return created.json()["sandboxID"], headers


@pytest.mark.fakes
async def test_state_a_backend_cannot_capture_is_a_400_naming_why(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox_id, headers = await _e2b_sandbox(api)

    async def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise StateUnsupported("no freezer on this host (cgroup v1 freezer missing)")

    service = api.services.sandboxes
    monkeypatch.setattr(service, "pause", unsupported)
    monkeypatch.setattr(service.state, "snapshot", unsupported)
    monkeypatch.setattr(service.state, "fork", unsupported)
    for path in ("pause", "snapshots", "fork"):
        answer = await api.client.post(f"/sandboxes/{sandbox_id}/{path}", headers=headers, json={})
        assert answer.status_code == 400, (path, answer.text)
        assert answer.json() == {
            "code": 400,
            "message": "no freezer on this host (cgroup v1 freezer missing)",
        }
    info = await api.client.get(f"/sandboxes/{sandbox_id}", headers=headers)
    assert info.json()["state"] == "running"


@pytest.mark.fakes
@pytest.mark.parametrize(
    ("error", "status"),
    [(TooManyRequests("fork of 3 refused as a whole: tenant budget"), 429),
     (SandboxError("fork: 1 of 3 children could not start"), 500)],
)  # fmt: skip
async def test_a_fork_that_could_not_start_every_child_answers_each_entry_with_why(
    api: Api, monkeypatch: pytest.MonkeyPatch, error: Exception, status: int
) -> None:
    sandbox_id, headers = await _e2b_sandbox(api)

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(api.services.sandboxes.state, "fork", refused)
    answer = await api.client.post(
        f"/sandboxes/{sandbox_id}/fork", headers=headers, json={"count": 3}
    )
    assert answer.status_code == 201, answer.text
    assert answer.json() == [{"error": {"code": status, "message": str(error)}}] * 3


@pytest.mark.fakes
async def test_a_fork_on_the_fakes_answers_sandboxes_with_tokens_and_e2bs_default_timeout(
    api: Api,
) -> None:
    sandbox_id, headers = await _e2b_sandbox(api)
    answer = await api.client.post(
        f"/sandboxes/{sandbox_id}/fork", headers=headers, json={"count": 2}
    )
    assert answer.status_code == 201, answer.text
    children = [entry["sandbox"] for entry in answer.json()]
    assert len({c["sandboxID"] for c in children} | {sandbox_id}) == 3
    assert all(c["envdAccessToken"] and c["trafficAccessToken"] for c in children)
    for child in children:
        native = await api.client.get(f"/v1/sandboxes/{child['sandboxID']}", headers=api.acme)
        body = native.json()
        lives = datetime.fromisoformat(body["expires_at"]) - datetime.fromisoformat(
            body["created_at"]
        )
        assert 10 < lives.total_seconds() < 20, "E2B's default: children live 15 s"
    too_many = await api.client.post(
        f"/sandboxes/{sandbox_id}/fork", headers=headers, json={"count": 17}
    )
    assert too_many.status_code == 400 and "at most 16" in too_many.json()["message"]
