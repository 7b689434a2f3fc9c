"""Sandbox metrics on real sandboxes (the local backend's cgroups and volumes): a CPU
burner shows as CPU, an allocation as memory, a written file as disk; the Prometheus
endpoint sums them without naming any sandbox; another tenant's sandbox is not found."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest

from tests.server.conftest import Api

pytestmark = pytest.mark.integration
MIB = 1 << 20


async def _create(api: Api, **spec: object) -> str:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json=spec, timeout=60)
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


async def _python(api: Api, sandbox_id: str, code: str) -> None:
    ran = await api.client.post(f"/v1/sandboxes/{sandbox_id}/code/execute", headers=api.acme,
                                json={"code": code}, timeout=60)  # fmt: skip
    assert ran.status_code == 200, ran.text
    lines = [json.loads(line) for line in ran.text.splitlines()]
    assert not [line for line in lines if line["type"] == "error"], lines


async def _metrics(api: Api, sandbox_id: str) -> dict[str, Any]:
    got = await api.client.get(f"/v1/sandboxes/{sandbox_id}/metrics", headers=api.acme)
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


async def _until(api: Api, sandbox_id: str, key: str, at_least: float) -> dict[str, Any]:
    """Read its metrics until ``key`` reaches ``at_least`` (bounded: 15 s)."""
    deadline = time.monotonic() + 15
    while True:
        metrics = await _metrics(api, sandbox_id)
        if metrics[key] >= at_least or time.monotonic() > deadline:
            return metrics
        await asyncio.sleep(0.3)


async def test_cpu_memory_and_disk_show_what_the_sandbox_does(api: Api) -> None:
    sandbox_id = await _create(api, timeout=300, limits={"cpus": 0.5, "memory": "512M"})
    idle = await _metrics(api, sandbox_id)
    assert idle["sandbox_id"] == sandbox_id
    assert idle["cpus"] == pytest.approx(0.5)
    assert idle["memory_limit"] == 512 * MIB
    assert idle["disk_limit"] > 0 and idle["pids"] >= 1
    assert idle["cpu_percent"] < 50

    await _python(api, sandbox_id, "import subprocess\n"
                  "burner = subprocess.Popen(['python3', '-c', 'while True: pass'])")  # fmt: skip
    busy = await _until(api, sandbox_id, "cpu_percent", 70)
    assert busy["cpu_percent"] >= 70, busy  # of its half core
    assert busy["cpu_percent"] <= 100
    assert busy["cpu_seconds"] > idle["cpu_seconds"]
    await _python(api, sandbox_id, "burner.kill(); burner.wait()")

    await _python(api, sandbox_id, "blob = b'\\x01' * (96 << 20)")
    held = await _metrics(api, sandbox_id)
    assert held["memory_bytes"] >= idle["memory_bytes"] + 90 * MIB, (idle, held)

    written = await api.client.put(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/home/user/big.bin"},
        headers={**api.acme, "content-type": "application/octet-stream"},
        content=b"\x02" * (20 * MIB),
    )  # fmt: skip
    assert written.status_code == 200, written.text
    filled = await _metrics(api, sandbox_id)
    assert filled["disk_bytes"] >= idle["disk_bytes"] + 20 * MIB, (idle, filled)
    assert filled["disk_bytes"] <= filled["disk_limit"]

    scraped = (await api.client.get("/v1/metrics")).text
    assert sandbox_id not in scraped and "acme" not in scraped
    assert _value(scraped, "ringfence_sandboxes_measured") == 1
    assert _value(scraped, "ringfence_sandboxes_memory_bytes") >= 90 * MIB
    assert _value(scraped, "ringfence_sandboxes_disk_bytes") >= 20 * MIB
    assert _value(scraped, 'ringfence_sandboxes_memory_use{le="+Inf"}') == 1


async def test_another_tenants_sandbox_is_not_found_and_an_ended_one_not_running(
    api: Api,
) -> None:
    sandbox_id = await _create(api, timeout=300)
    theirs = await api.client.get(f"/v1/sandboxes/{sandbox_id}/metrics", headers=api.globex)
    assert theirs.status_code == 404 and theirs.json()["error"]["code"] == "not_found"
    killed = await api.client.delete(f"/v1/sandboxes/{sandbox_id}", headers=api.acme)
    assert killed.status_code == 200, killed.text
    ended = await api.client.get(f"/v1/sandboxes/{sandbox_id}/metrics", headers=api.acme)
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "sandbox_not_running"


async def test_a_frozen_sandbox_is_read_and_stays_paused(api: Api) -> None:
    sandbox_id = await _create(api, timeout=300)
    paused = await api.client.post(f"/v1/sandboxes/{sandbox_id}/pause", headers=api.acme,
                                   json={"memory": True})  # fmt: skip
    assert paused.status_code == 200, paused.text
    metrics = await _metrics(api, sandbox_id)
    assert metrics["pids"] >= 1 and metrics["cpu_percent"] == 0
    got = await api.client.get(f"/v1/sandboxes/{sandbox_id}", headers=api.acme)
    assert got.json()["state"] == "paused"


async def test_a_rollback_shows_in_the_next_reading_of_an_idle_sandbox(api: Api) -> None:
    sandbox_id = await _create(api, timeout=300)
    base = f"/v1/sandboxes/{sandbox_id}"
    taken = await api.client.post(f"{base}/checkpoints", headers=api.acme)
    assert taken.status_code in (200, 201), taken.text
    written = await api.client.put(
        f"{base}/files", params={"path": "/home/user/big.bin"},
        headers={**api.acme, "content-type": "application/octet-stream"},
        content=b"\x02" * (20 * MIB),
    )  # fmt: skip
    assert written.status_code == 200, written.text
    full = await _metrics(api, sandbox_id)
    again = await _metrics(api, sandbox_id)  # idle: the same reading, carried cheaply
    assert again["disk_bytes"] == full["disk_bytes"] >= 20 * MIB
    rolled = await api.client.post(f"{base}/rollback", headers=api.acme,
                                   json={"checkpoint": taken.json()["id"]})  # fmt: skip
    assert rolled.status_code in (200, 204), rolled.text
    after = await _metrics(api, sandbox_id)
    assert after["disk_bytes"] <= full["disk_bytes"] - 19 * MIB, (full, after)


@pytest.mark.fakes  # the fake runtime's own readings: /proc of its processes, its home
async def test_the_fake_runtime_measures_its_processes_and_home(api: Api) -> None:
    sandbox_id = await _create(api, timeout=120)
    before = await _metrics(api, sandbox_id)
    assert before["pids"] >= 1 and before["memory_bytes"] > 0
    assert (before["cpus"], before["memory_limit"], before["disk_limit"]) == (0, 0, 0)
    written = await api.client.put(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/home/user/f.bin"},
        headers={**api.acme, "content-type": "application/octet-stream"},
        content=b"\x04" * (2 * MIB),
    )  # fmt: skip
    assert written.status_code == 200, written.text
    after = await _metrics(api, sandbox_id)
    assert after["disk_bytes"] >= before["disk_bytes"] + 2 * MIB


def _value(scraped: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", scraped, re.MULTILINE)
    assert match is not None, f"{series} not in:\n{scraped}"
    return float(match.group(1))
