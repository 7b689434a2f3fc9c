"""Pause, resume, checkpoints, snapshots and fork in the sandbox service, on the fake
runtime (its state is a copy of each sandbox's private home): the logic, fast. What the
local backend captures is tested on real sandboxes (tests/server/test_sandbox_state_api.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ringfence.audit.signing import SealKey
from ringfence.config import Config
from ringfence.errors import (
    CheckpointNotFound,
    InvalidRequest,
    SandboxNotFound,
    SandboxNotRunning,
    StateUnsupported,
    TooManyRequests,
)
from ringfence.models import SandboxSpec, SandboxState
from ringfence.service.audit import AuditLog
from ringfence.service.budget import Budget
from ringfence.service.credentials import CredentialKey
from ringfence.service.sandboxes import FROZEN_LOST_ERROR, SandboxService
from ringfence.store import MemoryStore, Store
from ringfence.testing.fakes import FakeSandboxRuntime
from ringfence.testing.fakes.state import FakeStatefulSandbox

OCTETS = {"content-type": "application/octet-stream"}
KEY = b"k" * 32


@dataclass
class World:
    service: SandboxService
    runtime: FakeSandboxRuntime
    store: Store
    audit: AuditLog
    budget: Budget
    config: Config


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with _world(tmp_path, MemoryStore()) as made:
        yield made


class _world:
    """A sandbox service on the fake runtime over ``store``, its data in ``data_dir``."""

    def __init__(
        self, data_dir: Path, store: Store, *, budget: Budget | None = None, **fake: Any
    ) -> None:
        self.config = Config(data_dir=data_dir, pool_sizes={})
        self.store = store
        self.budget = budget or Budget()
        self.fake = fake

    async def __aenter__(self) -> World:
        runtime = FakeSandboxRuntime(self.config, export_key=KEY, **self.fake)
        audit = AuditLog(self.store, SealKey.generate(), 3600)
        credentials = CredentialKey(b"c" * 32)
        service = SandboxService(
            self.store, runtime, self.config, audit, budget=self.budget, credentials=credentials
        )
        await service.reconcile()
        self.world = World(service, runtime, self.store, audit, self.budget, self.config)
        return self.world

    async def __aexit__(self, *exc: object) -> None:
        await self.world.service.aclose()
        await self.world.audit.aclose()


async def write(service: SandboxService, sandbox_id: str, path: str, data: bytes) -> None:
    daemon = await service.daemon("acme", sandbox_id)
    answer = await daemon.send("PUT", "/files", params={"path": path}, headers=OCTETS,
                               content=data)  # fmt: skip
    await answer.aread()
    assert answer.status_code in (200, 204), answer.status_code


async def read(service: SandboxService, sandbox_id: str, path: str) -> bytes | None:
    daemon = await service.daemon("acme", sandbox_id)
    answer = await daemon.send("GET", "/files", params={"path": path})
    body = await answer.aread()
    return body if answer.status_code == 200 else None


async def python(service: SandboxService, sandbox_id: str, code: str) -> str:
    daemon = await service.daemon("acme", sandbox_id)
    body = json.dumps({"code": code, "language": "python"}).encode()
    answer = await daemon.send("POST", "/execute", headers={"content-type": "application/json"},
                               content=body)  # fmt: skip
    lines = [json.loads(line) for line in (await answer.aread()).decode().splitlines()]
    return "".join(line["text"] for line in lines if line["type"] == "stdout")


async def actions(world: World) -> list[str]:
    await world.audit.flush()
    from ringfence.models import AuditQuery

    return [r.action for r in await world.store.list_audit(AuditQuery(limit=1000))]


async def test_checkpoint_and_rollback_restore_files_and_are_audited(world: World) -> None:
    sandbox = await world.service.create("acme", SandboxSpec())
    await write(world.service, sandbox.id, "/home/user/a", b"one")
    checkpoint = await world.service.state.checkpoint("acme", sandbox.id)
    await write(world.service, sandbox.id, "/home/user/a", b"two")
    await write(world.service, sandbox.id, "/home/user/b", b"new")
    assert [c.id for c in await world.service.state.checkpoints("acme", sandbox.id)] == [
        checkpoint.id
    ]
    await world.service.state.rollback("acme", sandbox.id, checkpoint.id)
    assert await read(world.service, sandbox.id, "/home/user/a") == b"one"
    assert await read(world.service, sandbox.id, "/home/user/b") is None
    with pytest.raises(CheckpointNotFound):
        await world.service.state.rollback("acme", sandbox.id, "ck00")
    with pytest.raises(SandboxNotFound):  # another tenant's sandbox: as if none
        await world.service.state.checkpoint("globex", sandbox.id)
    await world.service.state.delete_checkpoint("acme", sandbox.id, checkpoint.id)
    assert await world.service.state.checkpoints("acme", sandbox.id) == []
    done = await actions(world)
    for action in ("sandbox.checkpoint", "sandbox.rollback", "sandbox.checkpoint_delete"):
        assert action in done


async def test_a_checkpoint_of_another_sandbox_is_not_found(world: World) -> None:
    one = await world.service.create("acme", SandboxSpec())
    other = await world.service.create("acme", SandboxSpec())
    checkpoint = await world.service.state.checkpoint("acme", one.id)
    with pytest.raises(CheckpointNotFound):
        await world.service.state.rollback("acme", other.id, checkpoint.id)


async def test_pause_to_disk_frees_everything_and_resume_keeps_files_env_and_id(
    world: World,
) -> None:
    spec = SandboxSpec(env={"SECRET_TOKEN": "s3cr3t-value"}, metadata={"k": "v"}, timeout=120)
    sandbox = await world.service.create("acme", spec)
    await write(world.service, sandbox.id, "/home/user/kept", b"files survive")
    assert world.budget.held("acme")[0] == 1
    paused = await world.service.pause("acme", sandbox.id, memory=False)
    assert paused.memory is False and paused.sandbox.state is SandboxState.PAUSED
    assert paused.sandbox.expires_at is None and 100 < (paused.sandbox.timeout_left or 0) <= 120
    assert world.budget.held("acme") == (0, 0, 0.0) and world.service.running_count() == 0
    # The environment's values are kept sealed, never in clear, on the disk.
    saved = b"".join(p.read_bytes() for p in world.config.data_dir.rglob("*") if p.is_file())
    assert b"s3cr3t-value" not in saved
    resumed = await world.service.resume("acme", sandbox.id)
    assert resumed.id == sandbox.id and resumed.state is SandboxState.RUNNING
    assert resumed.metadata == {"k": "v"} and resumed.expires_at is not None
    assert await read(world.service, sandbox.id, "/home/user/kept") == b"files survive"
    assert "s3cr3t-value" in await python(
        world.service, sandbox.id, "import os; print(os.environ['SECRET_TOKEN'])"
    )
    assert world.budget.held("acme")[0] == 1
    assert {"sandbox.pause", "sandbox.resume"} <= set(await actions(world))


async def test_ten_pause_resume_cycles_lose_no_file(world: World) -> None:
    sandbox = await world.service.create("acme", SandboxSpec())
    for cycle in range(10):
        await write(world.service, sandbox.id, f"/home/user/f{cycle}", str(cycle).encode())
        await world.service.pause("acme", sandbox.id, memory=cycle % 2 == 0)
        await world.service.resume("acme", sandbox.id)
        for earlier in range(cycle + 1):
            assert await read(world.service, sandbox.id, f"/home/user/f{earlier}") == (
                str(earlier).encode()
            )


async def test_any_request_resumes_a_paused_sandbox_once(world: World) -> None:
    sandbox = await world.service.create("acme", SandboxSpec())
    await write(world.service, sandbox.id, "/home/user/x", b"x")
    await world.service.pause("acme", sandbox.id, memory=False)
    started = len(world.runtime.specs)
    reads = await asyncio.gather(
        *(read(world.service, sandbox.id, "/home/user/x") for _ in range(8))
    )
    assert reads == [b"x"] * 8
    assert len(world.runtime.specs) == started + 1  # one restart for all eight
    assert (await world.service.get("acme", sandbox.id)).state is SandboxState.RUNNING


async def test_auto_resume_off_refuses_requests_until_resumed(world: World) -> None:
    sandbox = await world.service.create("acme", SandboxSpec(auto_resume=False))
    await world.service.pause("acme", sandbox.id, memory=True)
    with pytest.raises(SandboxNotRunning, match="auto_resume"):
        await world.service.daemon("acme", sandbox.id)
    await world.service.resume("acme", sandbox.id)
    await world.service.daemon("acme", sandbox.id)


async def test_a_frozen_sandbox_keeps_its_processes_and_only_its_memory_counts(
    world: World,
) -> None:
    sandbox = await world.service.create("acme", SandboxSpec(limits={"memory": "256M"}))
    before = await python(world.service, sandbox.id, "import os; print(os.getpid())")
    await python(world.service, sandbox.id, "kept = 41")
    paused = await world.service.pause("acme", sandbox.id, memory=True)
    assert paused.memory is True and paused.sandbox.memory is True
    count, memory, cpus = world.budget.held("acme")
    assert count == 0 and memory == 256 << 20 and cpus == 0  # memory held, not running
    assert world.service.running_count() == 0
    assert await python(world.service, sandbox.id, "print(kept + 1)") == "42\n"  # resumed
    assert await python(world.service, sandbox.id, "import os; print(os.getpid())") == before
    assert world.budget.held("acme")[0] == 1


async def test_pause_without_a_freezer_is_refused_naming_why(tmp_path: Path) -> None:
    async with _world(tmp_path, MemoryStore(), freezer=False) as world:
        sandbox = await world.service.create("acme", SandboxSpec())
        with pytest.raises(StateUnsupported, match="memory=false"):
            await world.service.pause("acme", sandbox.id, memory=True)
        assert (await world.service.pause("acme", sandbox.id, memory=False)).memory is False


async def test_killing_a_paused_sandbox_removes_its_saved_files(world: World) -> None:
    sandbox = await world.service.create("acme", SandboxSpec())
    await world.service.pause("acme", sandbox.id, memory=False)
    assert list((world.config.data_dir / "state" / "paused").iterdir())
    killed = await world.service.kill("acme", sandbox.id)
    assert killed.state is SandboxState.KILLED
    assert not list((world.config.data_dir / "state" / "paused").iterdir())
    frozen = await world.service.create("acme", SandboxSpec())
    await world.service.pause("acme", frozen.id, memory=True)
    assert (await world.service.kill("acme", frozen.id)).state is SandboxState.KILLED
    with pytest.raises(SandboxNotRunning):
        await world.service.resume("acme", frozen.id)


async def test_a_paused_sandbox_survives_a_restart_and_a_frozen_one_is_saved_at_shutdown(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    async with _world(tmp_path, store) as world:
        disk = await world.service.create("acme", SandboxSpec(env={"A": "1"}))
        frozen = await world.service.create("acme", SandboxSpec())
        for sandbox in (disk, frozen):
            await write(world.service, sandbox.id, "/home/user/kept", sandbox.id.encode())
        await world.service.pause("acme", disk.id, memory=False)
        await world.service.pause("acme", frozen.id, memory=True)
    # Shut down cleanly: the frozen one was saved to disk (its memory could not be kept).
    for sandbox in (disk, frozen):
        stored = await store.get_sandbox("acme", sandbox.id)
        assert stored is not None and stored.state is SandboxState.PAUSED, stored
        assert stored.memory is False
    async with _world(tmp_path, store) as world:
        for sandbox in (disk, frozen):
            assert await read(world.service, sandbox.id, "/home/user/kept") == sandbox.id.encode()
        assert await python(world.service, disk.id, "import os; print(os.environ['A'])") == "1\n"


async def test_a_crash_loses_only_frozen_sandboxes_and_says_why(tmp_path: Path) -> None:
    store = MemoryStore()
    world = await _world(tmp_path, store).__aenter__()
    disk = await world.service.create("acme", SandboxSpec())
    frozen = await world.service.create("acme", SandboxSpec())
    await world.service.pause("acme", disk.id, memory=False)
    await world.service.pause("acme", frozen.id, memory=True)
    # A crash: the next server starts on the same store without this one shutting down.
    async with _world(tmp_path, store) as after:
        lost = await after.service.get("acme", frozen.id)
        assert lost.state is SandboxState.FAILED and lost.error == FROZEN_LOST_ERROR
        assert (await after.service.resume("acme", disk.id)).state is SandboxState.RUNNING
    await world.service.aclose()
    await world.audit.aclose()


async def test_auto_pause_pauses_an_idle_sandbox_to_disk(world: World) -> None:
    sandbox = await world.service.create("acme", SandboxSpec(auto_pause=1))
    await write(world.service, sandbox.id, "/home/user/kept", b"k")
    await _until(lambda: _state(world, sandbox.id), SandboxState.PAUSED)
    stored = await world.service.get("acme", sandbox.id)
    assert stored.memory is False
    assert await read(world.service, sandbox.id, "/home/user/kept") == b"k"


async def test_on_timeout_pause_pauses_instead_of_killing(world: World) -> None:
    sandbox = await world.service.create("acme", SandboxSpec(timeout=1, on_timeout="pause"))
    await _until(lambda: _state(world, sandbox.id), SandboxState.PAUSED)
    resumed = await world.service.resume("acme", sandbox.id)
    assert resumed.state is SandboxState.RUNNING
    # Paused by its timeout, it resumes with a fresh default one (not the second it had
    # left, which would pause it again at once).
    assert resumed.expires_at is not None
    lives = (resumed.expires_at - datetime.now(UTC)).total_seconds()
    assert lives > world.service.config.default_sandbox_timeout - 30


async def test_a_shorter_timeout_pauses_an_on_timeout_pause_sandbox_then(world: World) -> None:
    """set_timeout moves the pause too: the lifecycle does not sleep until the old deadline
    (the runtime's own deadline, a minute after the new one, would kill it first)."""
    sandbox = await world.service.create("acme", SandboxSpec(timeout=3000, on_timeout="pause"))
    await write(world.service, sandbox.id, "/home/user/f", b"x")  # its lifecycle waits by now
    await world.service.set_timeout("acme", sandbox.id, 1)
    await _until(lambda: _state(world, sandbox.id), SandboxState.PAUSED, seconds=10)


async def test_snapshots_start_new_sandboxes_and_belong_to_their_tenant(world: World) -> None:
    sandbox = await world.service.create("acme", SandboxSpec(metadata={"m": "1"}))
    await write(world.service, sandbox.id, "/home/user/base", b"from the snapshot")
    snapshot = await world.service.state.snapshot("acme", sandbox.id)
    assert snapshot.sandbox_id == sandbox.id and snapshot.bytes >= len(b"from the snapshot")
    assert [s.id for s in await world.service.state.snapshots("acme")] == [snapshot.id]
    assert await world.service.state.snapshots("globex") == []
    started = await world.service.create("acme", SandboxSpec(snapshot=snapshot.id))
    assert started.snapshot == snapshot.id
    assert await read(world.service, started.id, "/home/user/base") == b"from the snapshot"
    with pytest.raises(CheckpointNotFound):
        await world.service.create("globex", SandboxSpec(snapshot=snapshot.id))
    with pytest.raises(CheckpointNotFound):
        await world.service.state.delete_snapshot("globex", snapshot.id)
    await world.service.state.delete_snapshot("acme", snapshot.id)
    with pytest.raises(CheckpointNotFound):
        await world.service.create("acme", SandboxSpec(snapshot=snapshot.id))
    assert {"sandbox.snapshot", "snapshot.delete"} <= set(await actions(world))


async def test_fork_makes_distinct_children_with_the_parents_files(world: World) -> None:
    parent = await world.service.create("acme", SandboxSpec(env={"E": "e"}, metadata={"m": "1"}))
    await write(world.service, parent.id, "/home/user/shared", b"parent's")
    forked = await world.service.state.fork("acme", parent.id, 3)
    ids = [child.id for child in forked.children]
    assert len(set(ids)) == 3 and parent.id not in ids
    draws = set()
    for child in forked.children:
        assert child.metadata == {"m": "1"} and child.limits == parent.limits
        assert await read(world.service, child.id, "/home/user/shared") == b"parent's"
        draws.add(await python(world.service, child.id, "import random; print(random.random())"))
        env = await python(world.service, child.id, "import os; print(os.environ['E'], "
                           "os.environ['RINGFENCE_SANDBOX_ID'])")  # fmt: skip
        assert env == f"e {child.id}\n"
    assert len(draws) == 3  # every child's PRNG seeded anew
    await write(world.service, ids[0], "/home/user/own", b"first child's")
    assert await read(world.service, ids[1], "/home/user/own") is None
    assert "sandbox.fork" in await actions(world)


async def test_fork_is_refused_whole_without_room(tmp_path: Path) -> None:
    async with _world(tmp_path, MemoryStore(), budget=Budget(tenant_count=3)) as world:
        parent = await world.service.create("acme", SandboxSpec())
        with pytest.raises(TooManyRequests, match="refused as a whole"):
            await world.service.state.fork("acme", parent.id, 3)
        assert world.budget.held("acme")[0] == 1  # nothing made, nothing held
        assert len(await world.service.list("acme")) == 1
        with pytest.raises(InvalidRequest):
            await world.service.state.fork("acme", parent.id, 0)
        assert len((await world.service.state.fork("acme", parent.id, 2)).children) == 2


async def test_a_tampered_export_is_refused(world: World) -> None:
    sandbox = await world.service.create("acme", SandboxSpec())
    await write(world.service, sandbox.id, "/home/user/f", b"honest")
    await world.service.pause("acme", sandbox.id, memory=False)
    (planted,) = (world.config.data_dir / "state" / "paused").rglob("files/files/f")
    planted.write_bytes(b"tampered")
    with pytest.raises(Exception, match="seal"):
        await world.service.resume("acme", sandbox.id)
    assert (await world.service.get("acme", sandbox.id)).state is SandboxState.PAUSED


async def _state(world: World, sandbox_id: str) -> SandboxState:
    return (await world.store.get_sandbox("acme", sandbox_id)).state  # type: ignore[union-attr]


async def _until(probe: Callable[[], Any], wanted: object, seconds: float = 15) -> None:
    async with asyncio.timeout(seconds):
        while await probe() != wanted:
            await asyncio.sleep(0.05)


async def test_a_frozen_sandbox_without_room_to_thaw_stays_frozen(tmp_path: Path) -> None:
    async with _world(tmp_path, MemoryStore(), budget=Budget(tenant_count=1)) as world:
        frozen = await world.service.create("acme", SandboxSpec())
        await world.service.pause("acme", frozen.id, memory=True)
        other = await world.service.create("acme", SandboxSpec())  # room: frozen ones do not count
        with pytest.raises(TooManyRequests):
            await world.service.resume("acme", frozen.id)
        stored = await world.service.get("acme", frozen.id)
        assert stored.state is SandboxState.PAUSED and stored.memory is True
        await world.service.kill("acme", other.id)
        assert (await world.service.resume("acme", frozen.id)).state is SandboxState.RUNNING
        await world.audit.flush()
        from ringfence.models import AuditQuery

        records = await world.store.list_audit(AuditQuery(limit=1000))
        assert [r.outcome for r in records if r.action == "sandbox.resume"] == ["failed", "ok"]


async def test_a_refused_pause_is_audited(tmp_path: Path) -> None:
    async with _world(tmp_path, MemoryStore(), freezer=False) as world:
        sandbox = await world.service.create("acme", SandboxSpec())
        with pytest.raises(StateUnsupported):
            await world.service.pause("acme", sandbox.id, memory=True)
        await world.audit.flush()
        from ringfence.models import AuditQuery

        records = await world.store.list_audit(AuditQuery(limit=1000))
        (refused,) = [r for r in records if r.action == "sandbox.pause"]
        assert refused.outcome == "failed" and "freezer" in str(refused.details["error"])


class _Stateless:
    """A fake sandbox whose backend captures nothing (as the Pod backend's)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def state(self) -> Any:
        from ringfence.backends import StateSupport

        return StateSupport(False, False, False, ("no writable layer here",))


async def test_a_backend_without_state_refuses_clearly(tmp_path: Path) -> None:
    async with _world(tmp_path, MemoryStore()) as world:
        start = world.runtime.start

        async def stateless(spec: Any) -> Any:
            return _Stateless(await start(spec))

        world.runtime.start = stateless  # type: ignore[method-assign]
        with pytest.raises(StateUnsupported, match="no writable layer here"):
            await world.service.create("acme", SandboxSpec(auto_pause=60))
        (refused,) = await world.service.list("acme")
        assert refused.state is SandboxState.FAILED  # recorded, with why
        sandbox = await world.service.create("acme", SandboxSpec())
        for memory in (True, False):
            with pytest.raises(StateUnsupported, match="no writable layer here"):
                await world.service.pause("acme", sandbox.id, memory=memory)
        assert (await world.service.get("acme", sandbox.id)).state is SandboxState.RUNNING


WRITER = """
import os, time
n = 0
while True:
    n += 1
    with open('/home/user/n.new', 'w') as f:
        f.write(str(n))
    os.replace('/home/user/n.new', '/home/user/n')
    with open({ack!r} + '.new', 'w') as f:  # outside its files: what it has written
        f.write(str(n))
    os.replace({ack!r} + '.new', {ack!r})
    time.sleep(0.001)
"""


async def test_pause_to_disk_keeps_the_last_write_made_before_it(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = await world.service.create("acme", SandboxSpec())
    acked = tmp_path / "acked"
    writer = asyncio.create_task(python(world.service, sandbox.id, WRITER.format(ack=str(acked))))
    for _ in range(500):
        if acked.exists():
            break
        await asyncio.sleep(0.01)
    real_export = FakeStatefulSandbox.export

    async def slow_export(self: FakeStatefulSandbox, checkpoint_id: str, target: Path) -> None:
        seen = acked.read_text()  # a running writer moves on within milliseconds
        for _ in range(50):
            if acked.read_text() != seen:
                break
            await asyncio.sleep(0.01)
        await real_export(self, checkpoint_id, target)

    monkeypatch.setattr(FakeStatefulSandbox, "export", slow_export)
    await world.service.pause("acme", sandbox.id, memory=False)
    last = int(acked.read_text())
    with contextlib.suppress(Exception):
        await writer  # killed by the pause
    await world.service.resume("acme", sandbox.id)
    kept = await read(world.service, sandbox.id, "/home/user/n")
    assert kept is not None and int(kept) >= last, (kept, last)
