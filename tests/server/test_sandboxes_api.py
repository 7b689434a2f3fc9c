"""Interactive sandboxes over the HTTP API, on real sandboxes, served over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from ringfence.backends.local.bwrap import SANDBOX_UID
from ringfence.config import Config
from ringfence.service.sandboxes import SANDBOX_ID_VARIABLE
from tests.server._envd import STREAM, Ran, collect, envelope, messages, run, start_body
from tests.server.conftest import Api

# Each live sandbox runs as a host uid of its own from this range.
_SANDBOX_HOST_UIDS = range(Config().sandbox_uids[0], Config().sandbox_uids[1] + 1)


async def _create(api: Api, **spec: object) -> dict[str, object]:
    response = await api.client.post("/v1/sandboxes", headers=api.acme, json=spec)
    assert response.status_code == 201, response.text
    body: dict[str, object] = response.json()
    return body


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


@pytest.mark.every_store
async def test_create_get_list_kill(live: Api) -> None:
    sandbox = await _create(live, timeout=60, metadata={"team": "a", "run": "1"}, env={"X": "y"})
    assert sandbox["state"] == "running" and sandbox["template"] == "base"
    assert "env" not in sandbox, "the environment may hold secrets: never shown"
    other = await _create(live, metadata={"team": "b"})
    sandbox_id = sandbox["id"]

    got = await live.client.get(f"/v1/sandboxes/{sandbox_id}", headers=live.acme)
    assert got.json() == sandbox
    listed = await live.client.get(
        "/v1/sandboxes", headers=live.acme, params={"metadata": "team=a", "state": "running"}
    )
    assert [s["id"] for s in listed.json()] == [sandbox_id]
    everything = await live.client.get("/v1/sandboxes", headers=live.acme)
    assert [s["id"] for s in everything.json()] == [other["id"], sandbox_id]

    ran = await run(live.client, live.acme, str(sandbox_id), ["sh", "-c", "echo $X; id -u"])
    assert (ran.stdout, ran.end.get("exitCode", 0)) == (f"y\n{SANDBOX_UID}\n", 0)

    killed = await live.client.delete(f"/v1/sandboxes/{sandbox_id}", headers=live.acme)
    assert killed.json()["state"] == "killed" and killed.json()["ended_at"]
    again = await live.client.delete(f"/v1/sandboxes/{sandbox_id}", headers=live.acme)
    assert again.json() == killed.json()
    after = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/List", headers=live.acme, json={}
    )
    assert _error(after) == (409, "sandbox_not_running")
    stopped = await live.client.get(
        "/v1/sandboxes", headers=live.acme, params={"state": ["killed", "expired"]}
    )
    assert [s["id"] for s in stopped.json()] == [sandbox_id]


@pytest.mark.every_store
async def test_another_tenant_sees_and_touches_nothing(live: Api) -> None:
    sandbox_id = (await _create(live))["id"]
    base = f"/v1/sandboxes/{sandbox_id}"
    attempts = [
        live.client.get(base, headers=live.globex),
        live.client.delete(base, headers=live.globex),
        live.client.post(f"{base}/timeout", headers=live.globex, json={"timeout": 1}),
        live.client.post(f"{base}/rpc/process.Process/List", headers=live.globex, json={}),
        live.client.get(f"{base}/files", headers=live.globex, params={"path": "/etc/hostname"}),
        live.client.put(
            f"{base}/files", headers=live.globex, params={"path": "x"}, content=b"overwritten"
        ),
    ]
    for response in await asyncio.gather(*attempts):
        assert _error(response) == (404, "not_found"), response.text
    assert (await live.client.get("/v1/sandboxes", headers=live.globex)).json() == []
    mine = await live.client.get(base, headers=live.acme)
    assert mine.json()["state"] == "running"
    files = await live.client.get(f"{base}/files", headers=live.acme, params={"path": "x"})
    assert files.status_code == 404, "globex's upload must not have landed"


@pytest.mark.fakes  # logic
async def test_output_streams_while_the_command_runs(live: Api) -> None:
    """The command prints, then waits for input that is only sent once that print has
    arrived: without streaming, this would never end."""
    sandbox_id = (await _create(live))["id"]
    ran = Ran()
    async with live.client.stream(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/Start",
        headers={**live.acme, **STREAM},
        content=start_body(["sh", "-c", "echo ready; read line; echo got $line"], stdin=True),
    ) as response:
        async for flags, message in messages(response):
            collect(ran, flags, message)
            if ran.stdout == "ready\n":
                stdin = base64.b64encode(b"go\n").decode()
                sent = await live.client.post(
                    f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/SendInput",
                    headers=live.acme,
                    json={"process": {"pid": ran.pid}, "input": {"stdin": stdin}},
                )
                assert sent.status_code == 200, sent.text
    assert ran.stdout == "ready\ngot go\n" and ran.end["exited"]


@pytest.mark.fakes  # logic
async def test_files_round_trip_and_bad_paths(live: Api) -> None:
    sandbox_id = (await _create(live))["id"]
    files = f"/v1/sandboxes/{sandbox_id}/files"
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    written = await live.client.put(
        files, headers=live.acme, params={"path": "d/blob"}, content=data
    )
    assert written.status_code == 200, written.text
    assert written.json()[0]["path"] == "/home/user/d/blob"
    read = await live.client.get(files, headers=live.acme, params={"path": "/home/user/d/blob"})
    assert read.content == data and read.headers["content-length"] == str(len(data))
    missing = await live.client.get(files, headers=live.acme, params={"path": "nope"})
    assert missing.status_code == 404
    stat = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/rpc/filesystem.Filesystem/Stat",
        headers=live.acme,
        json={"path": "d/blob"},
    )
    assert stat.json()["entry"]["size"] in (len(data), str(len(data)))


@pytest.mark.fakes  # logic
async def test_a_large_upload_is_streamed_past_the_body_limit(live: Api) -> None:
    """The API buffers at most 4 MiB of a body; uploads stream through instead."""
    sandbox_id = (await _create(live))["id"]

    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(12):
            yield b"x" * (1 << 20)

    written = await live.client.put(
        f"/v1/sandboxes/{sandbox_id}/files",
        headers=live.acme,
        params={"path": "big"},
        content=chunks(),
    )
    assert written.status_code == 200, written.text
    ran = await run(live.client, live.acme, str(sandbox_id), ["stat", "-c", "%s", "big"])
    assert ran.stdout == f"{12 << 20}\n"
    unary = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/List",
        headers={**live.acme, "content-type": "application/json"},
        content=b" " * (5 << 20),
    )
    assert unary.status_code == 413


@pytest.mark.every_store
async def test_the_sandbox_expires_on_time_and_leaves_nothing(live: Api) -> None:
    sandbox_id = (await _create(live, timeout=300))["id"]
    await run(live.client, live.acme, str(sandbox_id), ["sh", "-c", "sleep 600 & echo started"])
    assert len(_sandbox_processes(sandbox_id)) >= 2, "the daemon and sleep, as the sandbox uid"
    moved = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/timeout", headers=live.acme, json={"timeout": 1}
    )
    assert moved.status_code == 200
    deadline = datetime.fromisoformat(moved.json()["expires_at"])
    set_at = time.monotonic()
    while True:
        state = (await live.client.get(f"/v1/sandboxes/{sandbox_id}", headers=live.acme)).json()
        if state["state"] != "running":
            break
        assert time.monotonic() - set_at < 30, "never expired"
        await asyncio.sleep(0.05)
    assert state["state"] == "expired" and state["expires_at"] is None
    # Killed, and everything of it removed, within a second of its deadline (the server's
    # own clock on both ends: this loop's polling does not count).
    ended = datetime.fromisoformat(state["ended_at"])
    assert timedelta(0) <= ended - deadline < timedelta(seconds=1), (deadline, ended)
    _assert_nothing_remains(sandbox_id)


async def test_killing_leaves_nothing(live: Api) -> None:
    sandbox_ids = [(await _create(live))["id"] for _ in range(3)]
    for sandbox_id in sandbox_ids:
        await run(live.client, live.acme, str(sandbox_id), ["sh", "-c", "sleep 600 &"])
    for sandbox_id in sandbox_ids:
        await live.client.delete(f"/v1/sandboxes/{sandbox_id}", headers=live.acme)
    _assert_nothing_remains(*sandbox_ids)


@pytest.mark.fakes  # logic
async def test_bad_input_is_a_clear_4xx(live: Api) -> None:
    sandbox_id = (await _create(live))["id"]
    cases = [
        (live.client.post("/v1/sandboxes", headers=live.acme, json={"template": "nope"}), 400),
        (live.client.post("/v1/sandboxes", headers=live.acme, json={"timeout": -1}), 400),
        (live.client.post("/v1/sandboxes", headers=live.acme, json={"env": {"1A": "x"}}), 400),
        (live.client.post("/v1/sandboxes", headers=live.acme, json={"bogus": 1}), 400),
        (
            live.client.post("/v1/sandboxes", headers=live.acme, json={"limits": {"memory": "1P"}}),
            400,
        ),
        (live.client.get("/v1/sandboxes", headers=live.acme, params={"metadata": "novalue"}), 400),
        (live.client.get("/v1/sandboxes", headers=live.acme, params={"state": "dancing"}), 400),
        (live.client.get("/v1/sandboxes/does-not-exist", headers=live.acme), 404),
        (live.client.post(f"/v1/sandboxes/{sandbox_id}/timeout", headers=live.acme, json={}), 400),
        (
            live.client.post(
                f"/v1/sandboxes/{sandbox_id}/rpc/evil.Service/Start", headers=live.acme
            ),
            400,
        ),
        (
            live.client.post(
                f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/a-b", headers=live.acme
            ),
            400,
        ),
        (live.client.post("/v1/sandboxes", json={}), 401),
    ]
    for pending, status in cases:
        response = await pending
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] and response.json()["error"]["message"]
    # The daemon's own errors come through in the native API's shape, too.
    unknown = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/Nope", headers=live.acme, json={}
    )
    assert _error(unknown) == (400, "invalid_request")
    # Marked as the sandbox's word, unlike the server's own errors.
    assert unknown.headers["ringfence-origin"] == "sandbox"
    gone = await live.client.get("/v1/sandboxes/does-not-exist", headers=live.acme)
    assert "ringfence-origin" not in gone.headers
    broken = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/rpc/filesystem.Filesystem/Stat",
        headers={**live.acme, "content-type": "application/json"},
        content=b"{not json",
    )
    assert _error(broken) == (400, "invalid_request")


@pytest.mark.every_store
async def test_a_sandbox_whose_daemon_dies_is_marked_failed(live: Api) -> None:
    sandbox_id = (await _create(live))["id"]
    # Root inside may kill the daemon (its own uid): the sandbox then ends. (The sandbox
    # user cannot: tests/server/test_root_inside.py.)
    async with live.client.stream(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/Start",
        headers={**live.acme, **STREAM},
        params={"user": "root"},
        content=envelope({"process": {"cmd": "sh", "args": ["-c", "kill -9 $PPID"]}}),
    ) as response:
        await response.aread()
    for _ in range(600):
        state = (await live.client.get(f"/v1/sandboxes/{sandbox_id}", headers=live.acme)).json()
        if state["state"] != "running":
            break
        await asyncio.sleep(0.05)
    assert state["state"] == "failed" and "daemon" in state["error"]
    _assert_nothing_remains(sandbox_id)


def _sandbox_processes(sandbox_id: object) -> list[int]:
    """Host processes of the sandbox user that run in this sandbox (every process of a
    sandbox inherits its id in the environment, unless it clears it: a process that did
    would still be caught by the cgroup check)."""
    marker = f"{SANDBOX_ID_VARIABLE}={sandbox_id}\0".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                # The real uid from status: /proc/PID of the (non-dumpable) daemon is root's.
                status = Path(f"/proc/{entry}/status").read_text()
                uid = int(status.split("\nUid:", 1)[1].split()[0])
                if (
                    uid in _SANDBOX_HOST_UIDS
                    and marker in Path(f"/proc/{entry}/environ").read_bytes()
                ):
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _assert_nothing_remains(*sandbox_ids: object) -> None:
    """No process of these sandboxes, no daemon socket, no sandbox cgroup of this process."""
    for sandbox_id in sandbox_ids:
        assert _sandbox_processes(sandbox_id) == []
    sockets = Path("/run/ringfence/sockets", f"i{os.getpid()}")
    assert not sockets.exists() or list(sockets.iterdir()) == []
    cgroups = list(Path("/sys/fs/cgroup").glob(f"*/**/ringfence/i{os.getpid()}/rf-*"))
    assert cgroups == []


@pytest.mark.fakes  # logic
async def test_metrics_count_live_sandboxes(live: Api) -> None:
    await _create(live)
    text = (await live.client.get("/v1/metrics")).text
    assert "# TYPE ringfence_sandboxes_running gauge" in text
    assert "ringfence_sandboxes_running 1\n" in text
