"""Sandbox state on the native API: pause/resume, checkpoints and rollback, fork, snapshots.

The routes' logic (shapes, refusals, tenants apart, the document) runs on the fakes; what
the sandboxes keep is tested on real ones where the local backend captures state."""

from __future__ import annotations

import pytest

from tests.server.conftest import Api

OCTETS = {"content-type": "application/octet-stream"}


async def _sandbox(api: Api, **spec: object) -> str:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json=spec)
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


async def _write(api: Api, sandbox_id: str, path: str, data: bytes) -> None:
    written = await api.client.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": path},
                                   headers={**api.acme, **OCTETS}, content=data)  # fmt: skip
    assert written.status_code == 200, written.text


async def _read(api: Api, sandbox_id: str, path: str) -> bytes | None:
    got = await api.client.get(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": path}, headers=api.acme
    )
    return got.content if got.status_code == 200 else None


@pytest.mark.fakes  # logic
async def test_pause_resume_and_implicit_resume_over_the_api(api: Api) -> None:
    sandbox_id = await _sandbox(api)
    await _write(api, sandbox_id, "/home/user/f", b"kept")
    base = f"/v1/sandboxes/{sandbox_id}"
    paused = await api.client.post(f"{base}/pause", headers=api.acme, json={"memory": False})
    assert paused.status_code == 200, paused.text
    assert paused.json()["memory"] is False and paused.json()["sandbox"]["state"] == "paused"
    listed = await api.client.get("/v1/sandboxes", params={"state": "paused"}, headers=api.acme)
    assert [s["id"] for s in listed.json()] == [sandbox_id]
    assert await _read(api, sandbox_id, "/home/user/f") == b"kept"  # resumed by the request
    assert (await api.client.get(base, headers=api.acme)).json()["state"] == "running"
    frozen = await api.client.post(f"{base}/pause", headers=api.acme, json={"memory": True})
    assert frozen.json()["memory"] is True
    resumed = await api.client.post(f"{base}/resume", headers=api.acme)
    assert resumed.status_code == 200 and resumed.json()["state"] == "running"
    theirs = await api.client.post(f"{base}/pause", headers=api.globex)
    assert theirs.status_code == 404


@pytest.mark.fakes  # logic
async def test_checkpoints_and_rollback_over_the_api(api: Api) -> None:
    sandbox_id = await _sandbox(api)
    base = f"/v1/sandboxes/{sandbox_id}"
    await _write(api, sandbox_id, "/home/user/f", b"one")
    made = await api.client.post(f"{base}/checkpoints", headers=api.acme)
    assert made.status_code == 201, made.text
    checkpoint = made.json()["id"]
    await _write(api, sandbox_id, "/home/user/f", b"two")
    listed = await api.client.get(f"{base}/checkpoints", headers=api.acme)
    assert [c["id"] for c in listed.json()] == [checkpoint]
    rolled = await api.client.post(
        f"{base}/rollback", headers=api.acme, json={"checkpoint": checkpoint}
    )
    assert rolled.status_code == 204, rolled.text
    assert await _read(api, sandbox_id, "/home/user/f") == b"one"
    unknown = await api.client.post(
        f"{base}/rollback", headers=api.acme, json={"checkpoint": "ck0"}
    )
    assert unknown.status_code == 404  # the checkpoint's 404, not the sandbox's
    assert unknown.json()["error"]["code"] == "checkpoint_not_found"
    bad = await api.client.post(f"{base}/rollback", headers=api.acme, json={"checkpoint": "../x"})
    assert bad.status_code == 400
    gone = await api.client.delete(f"{base}/checkpoints/{checkpoint}", headers=api.acme)
    assert gone.status_code == 204
    again = await api.client.delete(f"{base}/checkpoints/{checkpoint}", headers=api.acme)
    assert again.status_code == 404


@pytest.mark.fakes  # logic
async def test_fork_and_snapshots_over_the_api(api: Api) -> None:
    sandbox_id = await _sandbox(api, metadata={"m": "1"})
    await _write(api, sandbox_id, "/home/user/f", b"parent")
    forked = await api.client.post(
        f"/v1/sandboxes/{sandbox_id}/fork", headers=api.acme, json={"count": 2}
    )
    assert forked.status_code == 201, forked.text
    children = [child["id"] for child in forked.json()["children"]]
    assert len(set(children)) == 2 and sandbox_id not in children
    for child in children:
        assert await _read(api, child, "/home/user/f") == b"parent"
    too_many = await api.client.post(
        f"/v1/sandboxes/{sandbox_id}/fork", headers=api.acme, json={"count": 1000}
    )
    assert too_many.status_code == 400
    made = await api.client.post(f"/v1/sandboxes/{sandbox_id}/snapshot", headers=api.acme)
    assert made.status_code == 201, made.text
    snapshot = made.json()["id"]
    assert [s["id"] for s in (await api.client.get("/v1/snapshots", headers=api.acme)).json()] == [
        snapshot
    ]
    assert (
        await api.client.get(f"/v1/snapshots/{snapshot}", headers=api.globex)
    ).status_code == 404
    started = await _sandbox(api, snapshot=snapshot)
    assert await _read(api, started, "/home/user/f") == b"parent"
    theirs = await api.client.post("/v1/sandboxes", headers=api.globex, json={"snapshot": snapshot})
    assert theirs.status_code == 404
    assert (
        await api.client.delete(f"/v1/snapshots/{snapshot}", headers=api.acme)
    ).status_code == 204
    assert (await api.client.get(f"/v1/snapshots/{snapshot}", headers=api.acme)).status_code == 404


@pytest.mark.fakes  # logic
async def test_the_document_lists_the_state_routes_with_their_errors(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    paths = document["paths"]
    for path, method, status in [
        ("/v1/sandboxes/{sandbox_id}/pause", "post", "409"),
        ("/v1/sandboxes/{sandbox_id}/resume", "post", "429"),
        ("/v1/sandboxes/{sandbox_id}/checkpoints", "post", "507"),
        ("/v1/sandboxes/{sandbox_id}/rollback", "post", "404"),
        ("/v1/sandboxes/{sandbox_id}/fork", "post", "429"),
        ("/v1/snapshots/{snapshot_id}", "delete", "404"),
    ]:
        assert status in paths[path][method]["responses"], (path, method, status)
