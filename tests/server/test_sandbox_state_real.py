"""Sandbox state end to end on real sandboxes (the local backend's volumes, freezer and
exports): pause/resume cycles keep every file (and, frozen, every process), a paused
sandbox survives a server restart, and a fork's children are apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import Api
from tests.server.test_serve_process import Server

pytestmark = pytest.mark.integration
OCTETS = {"content-type": "application/octet-stream"}
_PIDS = "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"


async def _create(api: Api, **spec: object) -> dict[str, Any]:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json=spec, timeout=60)
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    return body


async def _write(api: Api, sandbox_id: str, path: str, data: bytes) -> None:
    written = await api.client.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": path},
                                   headers={**api.acme, **OCTETS}, content=data)  # fmt: skip
    assert written.status_code == 200, written.text


async def _read(
    api: Api, sandbox_id: str, path: str, headers: dict[str, str] | None = None
) -> bytes | None:
    got = await api.client.get(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": path}, headers=headers or api.acme
    )
    return got.content if got.status_code == 200 else None


async def _python(api: Api, sandbox_id: str, code: str) -> str:
    ran = await api.client.post(f"/v1/sandboxes/{sandbox_id}/code/execute", headers=api.acme,
                                json={"code": code}, timeout=60)  # fmt: skip
    assert ran.status_code == 200, ran.text
    lines = [json.loads(line) for line in ran.text.splitlines()]
    assert not [line for line in lines if line["type"] == "error"], lines
    return "".join(line["text"] for line in lines if line["type"] == "stdout")


@pytest.mark.every_store
async def test_ten_pause_resume_cycles_lose_no_file_and_frozen_ones_no_process(api: Api) -> None:
    sandbox_id = (await _create(api, timeout=600))["id"]
    base = f"/v1/sandboxes/{sandbox_id}"
    await _python(
        api, sandbox_id, "import subprocess; sleeper = subprocess.Popen(['sleep', '900'])"
    )
    for cycle in range(10):
        await _write(api, sandbox_id, f"/home/user/f{cycle}", f"cycle {cycle}".encode())
        memory = cycle % 2 == 0
        before = await _python(api, sandbox_id, _PIDS) if memory else None
        paused = await api.client.post(f"{base}/pause", headers=api.acme, json={"memory": memory},
                                       timeout=60)  # fmt: skip
        assert paused.status_code == 200, paused.text
        assert paused.json()["memory"] is memory
        resumed = await api.client.post(f"{base}/resume", headers=api.acme, timeout=60)
        assert resumed.status_code == 200, resumed.text
        if before is not None:
            assert await _python(api, sandbox_id, _PIDS) == before  # the same processes
        for earlier in range(cycle + 1):
            assert await _read(api, sandbox_id, f"/home/user/f{earlier}") == (
                f"cycle {earlier}".encode()
            ), (cycle, earlier)


@pytest.mark.every_store
async def test_fork_children_are_distinct_apart_and_seeded_anew(api: Api) -> None:
    parent = (await _create(api, timeout=600))["id"]
    await _write(api, parent, "/home/user/shared", b"from the parent")
    forked = await api.client.post(f"/v1/sandboxes/{parent}/fork", headers=api.acme,
                                   json={"count": 3}, timeout=120)  # fmt: skip
    assert forked.status_code == 201, forked.text
    children = [child["id"] for child in forked.json()["children"]]
    assert len(set(children)) == 3 and parent not in children
    draws = set()
    for child in children:
        assert await _read(api, child, "/home/user/shared") == b"from the parent"
        draws.add(await _python(api, child, "import random; print(random.random())"))
        await _write(api, child, "/home/user/mine", child.encode())
    assert len(draws) == 3
    for child in children:
        # Each sees its own file only: another child's volume is not in its view.
        assert await _read(api, child, "/home/user/mine") == child.encode()
        listing = await _python(api, child, "import os; print(sorted(os.listdir('/home/user')))")
        assert listing == "['mine', 'shared']\n", listing
    assert await _read(api, parent, "/home/user/mine") is None


def test_a_paused_sandbox_survives_a_server_restart(local_host: object, tmp_path: Path) -> None:
    server = Server(tmp_path / "data", None)
    server.start()
    try:
        key = (server.data_dir / "admin-key").read_text().strip()
        headers = {"Authorization": f"Bearer {key}"}
        created = httpx.post(f"{server.url}/v1/sandboxes", headers=headers,
                             json={"env": {"KEPT": "yes"}}, timeout=60)  # fmt: skip
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["id"]
        files = f"{server.url}/v1/sandboxes/{sandbox_id}/files"
        written = httpx.put(files, params={"path": "/home/user/kept"}, content=b"across restarts",
                            headers={**headers, **OCTETS}, timeout=60)  # fmt: skip
        assert written.status_code == 200, written.text
        paused = httpx.post(f"{server.url}/v1/sandboxes/{sandbox_id}/pause", headers=headers,
                            json={"memory": False}, timeout=60)  # fmt: skip
        assert paused.status_code == 200, paused.text
    finally:
        server.stop()
    server.start()
    try:
        got = httpx.get(files, params={"path": "/home/user/kept"}, headers=headers, timeout=60)
        assert got.status_code == 200 and got.content == b"across restarts", got.text
        code = {"code": "import os; print(os.environ['KEPT'])"}
        ran = httpx.post(f"{server.url}/v1/sandboxes/{sandbox_id}/code/execute", headers=headers,
                         json=code, timeout=60)  # fmt: skip
        assert '"yes\\n"' in ran.text, ran.text
        record = httpx.get(f"{server.url}/v1/sandboxes/{sandbox_id}", headers=headers).json()
        assert record["state"] == "running"
    finally:
        server.stop()
