"""Sandbox state through E2B's unmodified SDK: pause and connect's resume, ``list`` of paused
sandboxes, the lifecycle's ``on_timeout="pause"`` and ``auto_resume``, snapshots (create,
list, create from, delete) and ``fork(count)``; on real sandboxes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from e2b import (
    AsyncSandbox,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
)
from tests.e2b.conftest import E2bServer, audit_records

pytestmark = pytest.mark.integration
JS_SCENARIO = Path(__file__).parents[1] / "js" / "e2b_state.mjs"


def _until(condition: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.1)


_SLEEPER = "sleep 913"  # a process told apart by its command line (pids repeat after a restart)


def _sleeping(sbx: Sandbox) -> bool:
    """Whether ``_SLEEPER`` runs in the sandbox."""
    listing = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
    return f"{_SLEEPER} " in sbx.commands.run(listing).stdout


def _listed(tag: str, *states: SandboxState) -> dict[str, SandboxState]:
    query = SandboxQuery(metadata={"tag": tag}, state=list(states) or None)
    return {s.sandbox_id: s.state for s in Sandbox.list(query=query).next_items()}


def test_pause_lists_it_paused_and_connect_resumes_it_with_files_and_processes(
    e2b_server: E2bServer,
) -> None:
    tag = uuid.uuid4().hex
    sbx = Sandbox.create(timeout=300, metadata={"tag": tag})
    try:
        sbx.files.write("/home/user/kept.txt", "before the pause")
        sbx.commands.run(_SLEEPER, background=True)
        assert sbx.pause() is True
        assert sbx.pause() is False, "a paused sandbox is E2B's 409: already paused"
        assert sbx.beta_pause() is False
        assert _listed(tag, SandboxState.PAUSED) == {sbx.sandbox_id: SandboxState.PAUSED}
        assert _listed(tag, SandboxState.RUNNING) == {}
        assert _listed(tag) == {sbx.sandbox_id: SandboxState.PAUSED}, "both states by default"
        info = sbx.get_info()
        assert info.state is SandboxState.PAUSED
        assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
        # E2B's default: no auto_resume, so traffic does not wake it (the SDK's "not running").
        assert not sbx.is_running()
        with pytest.raises(SandboxNotRunningException):
            sbx.files.read("/home/user/kept.txt")
        for state_call in (sbx.create_snapshot, sbx.fork):
            with pytest.raises(SandboxException, match="paused: connect to it first"):
                state_call()
        assert sbx.get_info().state is SandboxState.PAUSED, "neither woke it"

        again = Sandbox.connect(sbx.sandbox_id)
        left = again.get_info().end_at - datetime.now(UTC)
        assert timedelta(seconds=250) < left <= timedelta(seconds=301), "E2B's default 300 s"
        assert again.files.read("/home/user/kept.txt") == "before the pause"
        assert _sleeping(again), "paused keeping memory: its processes go on"
        assert sbx.is_running(), "the tokens handed out before the pause still serve"
        assert again.get_info().state is SandboxState.RUNNING
    finally:
        sbx.kill()
    target = f"sandbox:{sbx.sandbox_id}"
    key_id = e2b_server.key.split("_")[1]
    for action in ("sandbox.pause", "sandbox.resume"):
        assert [r["actor"] for r in audit_records(e2b_server, target, action)] == [key_id]


def test_a_filesystem_pause_and_a_reboot_keep_the_files_and_restart_the_processes(
    e2b_server: E2bServer,
) -> None:
    with Sandbox.create(timeout=300) as sbx:
        sbx.files.write("/home/user/kept.txt", "on disk")
        sbx.commands.run(_SLEEPER, background=True)
        assert _sleeping(sbx)
        assert sbx.pause(mode="filesystem") is True
        assert sbx.get_info().state is SandboxState.PAUSED
        again = Sandbox.connect(sbx.sandbox_id, timeout=200)
        assert again.files.read("/home/user/kept.txt") == "on disk"
        assert not _sleeping(again), "files only: its processes started again"
        left = again.get_info().end_at - datetime.now(UTC)
        assert timedelta(seconds=150) < left <= timedelta(seconds=201), "resumed for 200 s"

        again.commands.run(_SLEEPER, background=True)
        assert again.pause() is True  # keeping memory...
        rebooted = Sandbox.connect(sbx.sandbox_id, on_resume="reboot")  # ...dropped here
        assert rebooted.files.read("/home/user/kept.txt") == "on disk"
        assert not _sleeping(rebooted)


def test_on_timeout_pause_then_a_request_resumes_it(e2b_server: E2bServer) -> None:
    sbx = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sbx.files.write("/home/user/kept.txt", "through the timeout")
        assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        sbx.set_timeout(2)  # a shorter timeout moves the pause too
        _until(lambda: sbx.get_info().state is SandboxState.PAUSED, seconds=30)
        assert sbx.files.read("/home/user/kept.txt") == "through the timeout"
        info = sbx.get_info()
        assert info.state is SandboxState.RUNNING, "the request resumed it"
        # As E2B's auto-resume: a fresh timeout of at least 5 minutes, not the second left.
        assert info.end_at - datetime.now(UTC) > timedelta(seconds=250)
    finally:
        sbx.kill()


def test_a_killed_paused_sandbox_is_gone(e2b_server: E2bServer) -> None:
    tag = uuid.uuid4().hex
    sbx = Sandbox.create(metadata={"tag": tag})
    assert sbx.pause(mode="filesystem", strict=True) is True, "its daemon answered"
    assert sbx.kill() is True
    assert sbx.kill() is False
    assert _listed(tag) == {}
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        sbx.pause()
    frozen = Sandbox.create(metadata={"tag": tag})
    assert frozen.pause() is True, "frozen, its processes stopped"
    assert frozen.kill() is True, "a frozen sandbox is killed too"
    assert _listed(tag) == {}


def test_a_snapshot_starts_new_sandboxes_with_its_files_until_deleted(
    e2b_server: E2bServer,
) -> None:
    with Sandbox.create() as sbx:
        sbx.files.write("/home/user/kept.txt", "in the snapshot")
        snapshot = sbx.create_snapshot()
        sbx.files.write("/home/user/kept.txt", "after the snapshot")
        assert sbx.is_running(), "the sandbox keeps running"
        assert snapshot.snapshot_id.startswith("sn")
        listed = [s.snapshot_id for s in sbx.list_snapshots().next_items()]
        assert listed == [snapshot.snapshot_id]
        everyone = Sandbox.list_snapshots().next_items()
        assert snapshot.snapshot_id in [s.snapshot_id for s in everyone]
        theirs = Sandbox.list_snapshots(api_key=e2b_server.other_key).next_items()
        assert snapshot.snapshot_id not in [s.snapshot_id for s in theirs], "a tenant's own"
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, api_key=e2b_server.other_key) is False

        with Sandbox.create(snapshot.snapshot_id) as child:
            assert child.files.read("/home/user/kept.txt") == "in the snapshot"
            assert child.get_info().template_id == snapshot.snapshot_id

        with pytest.raises(SandboxException, match="name"):
            sbx.create_snapshot("named")
        with pytest.raises(SandboxException, match="memory"):
            sbx.create_snapshot(mode="full")

    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
    assert Sandbox.delete_snapshot("no-such-snapshot") is False
    with pytest.raises(SandboxException, match="no snapshot"):
        Sandbox.create(snapshot.snapshot_id)
    with pytest.raises(SandboxException, match="Ringfence template"):
        Sandbox.delete_snapshot("base")


def test_fork_makes_distinct_children_from_the_parents_files(e2b_server: E2bServer) -> None:
    with Sandbox.create(timeout=300) as sbx:
        sbx.files.write("/home/user/kept.txt", "from the parent")
        children = sbx.fork(count=2, timeout=120)
        try:
            assert all(isinstance(child, Sandbox) for child in children), children
            first, second = (child for child in children if isinstance(child, Sandbox))
            ids = {sbx.sandbox_id, first.sandbox_id, second.sandbox_id}
            assert len(ids) == 3
            for child in (first, second):
                assert child.files.read("/home/user/kept.txt") == "from the parent"
                left = child.get_info().end_at - datetime.now(UTC)
                assert timedelta(seconds=100) < left <= timedelta(seconds=121)
            first.files.write("/home/user/kept.txt", "first's own")
            assert second.files.read("/home/user/kept.txt") == "from the parent"
            assert sbx.files.read("/home/user/kept.txt") == "from the parent"
            assert first._envd_access_token != second._envd_access_token
        finally:
            for child in children:
                if isinstance(child, Sandbox):
                    child.kill()
        with pytest.raises(SandboxException, match="at most 16"):
            sbx.fork(count=17)
    with pytest.raises(SandboxNotFoundException):
        sbx.fork()


def test_the_server_refuses_lifecycles_e2b_refuses(e2b_server: E2bServer) -> None:
    """What the SDK checks itself, the server checks too (other clients, older SDKs); and
    v1's resume cannot change the on_timeout set at create."""
    with Sandbox.create() as sbx:
        assert sbx.pause() is True
        resumed = httpx.post(
            f"{e2b_server.url}/sandboxes/{sbx.sandbox_id}/resume",
            headers={"X-API-KEY": e2b_server.key},
            json={"timeout": 60, "autoPause": True},
        )
        assert resumed.status_code == 400 and "autoPause" in resumed.text, resumed.text
        assert sbx.get_info().state is SandboxState.PAUSED
        resumed = httpx.post(
            f"{e2b_server.url}/sandboxes/{sbx.sandbox_id}/resume",
            headers={"X-API-KEY": e2b_server.key},
            json={"timeout": 60, "autoPause": False},
        )
        assert resumed.status_code == 201, resumed.text
        assert sbx.get_info().state is SandboxState.RUNNING
    for body, word in (
        ({"autoResume": {"enabled": True}}, "autoResume"),
        ({"autoPause": True, "autoPauseMemory": False, "autoResume": {"enabled": True}},
         "autoResume"),
    ):  # fmt: skip
        created = httpx.post(
            f"{e2b_server.url}/v2/sandboxes",
            headers={"X-API-KEY": e2b_server.key},
            json={"templateID": "base", **body},
        )
        assert created.status_code == 400 and word in created.json()["message"], created.text


async def test_the_async_sdk_pauses_lists_connects_snapshots_and_forks(
    e2b_server: E2bServer,
) -> None:
    tag = uuid.uuid4().hex
    sbx = await AsyncSandbox.create(timeout=300, metadata={"tag": tag})
    made: list[AsyncSandbox] = []
    try:
        await sbx.files.write("/home/user/kept.txt", "async")
        assert await sbx.pause() is True
        assert await sbx.pause() is False
        query = SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED])
        assert [s.sandbox_id for s in await AsyncSandbox.list(query=query).next_items()] == [
            sbx.sandbox_id
        ]
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        assert await again.files.read("/home/user/kept.txt") == "async"
        snapshot = await sbx.create_snapshot()
        made.append(await AsyncSandbox.create(snapshot.snapshot_id))
        assert await made[0].files.read("/home/user/kept.txt") == "async"
        assert await AsyncSandbox.delete_snapshot(snapshot.snapshot_id) is True
        children = await sbx.fork(count=2, timeout=60)
        made += [child for child in children if isinstance(child, AsyncSandbox)]
        assert len({child.sandbox_id for child in made[1:]}) == 2, children
    finally:
        for other in made:
            await other.kill()
        await sbx.kill()


def test_js_sdk_state_scenario(e2b_server: E2bServer) -> None:
    node = shutil.which("node")
    assert node, "the machine's node is required (scripts/setup installs it)"
    done = subprocess.run(
        [node, str(JS_SCENARIO)],
        cwd=JS_SCENARIO.parent,
        env={**os.environ, "E2B_API_URL": e2b_server.url, "E2B_SANDBOX_URL": e2b_server.url,
             "E2B_API_KEY": e2b_server.key},
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "paused": True,
        "pausedAgain": False,
        "listedPaused": ["paused"],
        "listedRunning": [],
        "readAfterResume": "kept by js",
        "stateAfterResume": "running",
        "snapshotListed": [True],
        "readFromSnapshot": "kept by js",
        "deleted": True,
        "deletedAgain": False,
        "forked": ["sandbox", "sandbox"],
        "distinct": 3,
        "readInChildren": ["kept by js", "kept by js"],
        "killed": True,
    }


def test_another_tenant_can_touch_neither_a_paused_sandbox_nor_a_snapshot(
    e2b_server: E2bServer,
) -> None:
    """Tenant globex's key, knowing the ids: every state door answers "not found", and
    nothing of acme's changes."""
    theirs = {"api_key": e2b_server.other_key}
    with Sandbox.create() as sbx:
        sbx.files.write("/home/user/secret.txt", "acme's")
        snapshot = sbx.create_snapshot()
        assert sbx.pause() is True
        for attempt in (
            lambda: Sandbox.connect(sbx.sandbox_id, **theirs),
            lambda: Sandbox.pause(sbx.sandbox_id, **theirs),
            lambda: Sandbox.fork(sbx.sandbox_id, **theirs),
            lambda: Sandbox.create_snapshot(sbx.sandbox_id, **theirs),
            lambda: Sandbox.get_info(sbx.sandbox_id, **theirs),
        ):
            with pytest.raises(SandboxNotFoundException):
                attempt()
        assert Sandbox.kill(sbx.sandbox_id, **theirs) is False
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **theirs) is False
        with pytest.raises(SandboxException, match="no snapshot"):
            Sandbox.create(snapshot.snapshot_id, **theirs)
        query = SandboxQuery(state=[SandboxState.PAUSED])
        listed = Sandbox.list(query=query, **theirs).next_items()
        assert sbx.sandbox_id not in {s.sandbox_id for s in listed}
        assert sbx.get_info().state is SandboxState.PAUSED, "none of them woke it"
        assert Sandbox.connect(sbx.sandbox_id).files.read("/home/user/secret.txt") == "acme's"
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
