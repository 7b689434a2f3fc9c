"""The warm pool on real sandboxes: claims are served ready, the pool refills, and nothing
of one claim is visible to the next."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.backends.local.sandbox import LocalSandbox
from ringfence.config import Config
from ringfence.errors import SandboxNotFound, SandboxNotRunning, StoreError
from ringfence.models import ExecutionResult, ResourceLimits, Sandbox, SandboxSpec, SandboxState
from ringfence.service.budget import Budget
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.pool import WarmPool
from ringfence.service.sandboxes import SandboxService, template_image
from ringfence.store import MemoryStore


class GatedStore(MemoryStore):
    """A store whose sandbox records are written only when the test lets them (or fail)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def add_sandbox(self, tenant: str, sandbox: Sandbox) -> None:
        await self.gate.wait()
        if self.fail:
            raise StoreError("the database is gone")
        await super().add_sandbox(tenant, sandbox)


@pytest.fixture
def store() -> GatedStore:
    return GatedStore()


@pytest.fixture
async def pooled(local_host: object, store: GatedStore) -> AsyncIterator[SandboxService]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    config = Config()
    runtime = LocalSandboxRuntime(LocalExecutor(config, host=local_host), config)
    pool = WarmPool(runtime, config, {"base": 2}, lambda name: template_image(name, config))
    service = SandboxService(store, runtime, config, pool=pool, budget=Budget.for_server(config))
    service.start()
    yield service
    await service.aclose()


async def _until_ready(service: SandboxService, count: int) -> None:
    for _ in range(400):
        if service.pool_stats()["base"].size >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the pool never held {count}: {service.pool_stats()}")


async def _run(service: SandboxService, sandbox_id: str, script: str) -> str:
    daemon = await service.daemon("acme", sandbox_id)
    body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", script]}}).encode()
    response = await daemon.send(
        "POST",
        "/process.Process/Start",
        headers={"content-type": "application/connect+json"},
        content=struct.pack(">BI", 0, len(body)) + body,
    )
    raw = await response.aread()
    out = b""
    while raw:
        _, length = struct.unpack(">BI", raw[:5])
        message = json.loads(raw[5 : 5 + length])
        raw = raw[5 + length :]
        data = message.get("event", {}).get("data", {})
        if "stdout" in data:
            import base64

            out += base64.b64decode(data["stdout"])
    return out.decode()


async def test_claims_are_served_ready_and_the_pool_refills(pooled: SandboxService) -> None:
    await _until_ready(pooled, 2)
    first = await pooled.create("acme", SandboxSpec(env={"WHO": "first"}, timeout=60))
    stats = pooled.pool_stats()["base"]
    assert (stats.hits, stats.misses) == (1, 0)
    assert (
        await _run(pooled, first.id, 'echo "$WHO $RINGFENCE_SANDBOX_ID"') == f"first {first.id}\n"
    )
    await _until_ready(pooled, 2)  # refilled in the background
    custom = await pooled.create("acme", SandboxSpec(limits=ResourceLimits(memory="64M")))
    assert pooled.pool_stats()["base"].misses == 1, "custom limits are not the pool's"
    assert custom.limits.memory == 64 << 20


async def test_nothing_of_one_claim_is_visible_to_the_next(pooled: SandboxService) -> None:
    await _until_ready(pooled, 2)
    one = await pooled.create("acme", SandboxSpec(env={"SECRET": "one-only"}))
    await _run(pooled, one.id, "echo mine > /home/user/left-behind; echo x > /tmp/t")
    await pooled.kill("acme", one.id)
    two = await pooled.create("acme", SandboxSpec())
    seen = await _run(
        pooled, two.id, 'ls /home/user /tmp; echo "secret=$SECRET id=$RINGFENCE_SANDBOX_ID"'
    )
    assert "left-behind" not in seen and "one-only" not in seen
    assert f"id={two.id}" in seen and one.id not in seen
    assert pooled.pool_stats()["base"].hits == 2


async def test_a_claimed_sandbox_keeps_the_claimers_timeout(pooled: SandboxService) -> None:
    await _until_ready(pooled, 1)
    sandbox = await pooled.create("acme", SandboxSpec(timeout=1))
    for _ in range(100):
        if (await pooled.get("acme", sandbox.id)).state.value != "running":
            break
        await asyncio.sleep(0.05)
    assert (await pooled.get("acme", sandbox.id)).state.value == "expired"


async def test_a_claim_answers_before_its_record_and_readers_wait_for_it(
    pooled: SandboxService, store: GatedStore
) -> None:
    await _until_ready(pooled, 1)
    store.gate.clear()  # the record is not written until we say so
    sandbox = await asyncio.wait_for(pooled.create("acme", SandboxSpec()), 10)
    assert await _run(pooled, sandbox.id, "echo usable") == "usable\n"
    got = asyncio.create_task(pooled.get("acme", sandbox.id))
    listed = asyncio.create_task(pooled.list("acme"))
    await asyncio.sleep(0.1)
    assert not got.done() and not listed.done(), "readers wait for the record"
    store.gate.set()
    assert (await got).id == sandbox.id
    assert [s.id for s in await listed] == [sandbox.id]
    ended = await pooled.kill("acme", sandbox.id)
    assert ended.state is SandboxState.KILLED


async def test_a_claim_whose_record_fails_is_killed(
    pooled: SandboxService, store: GatedStore
) -> None:
    await _until_ready(pooled, 1)
    store.gate.clear()
    store.fail = True
    sandbox = await pooled.create("acme", SandboxSpec())  # answered before the write
    store.gate.set()
    await _until_none_run(pooled)  # killed at once; its end cannot be stored either
    with pytest.raises(SandboxNotFound):  # it never was, as far as the store knows
        await pooled.daemon("acme", sandbox.id)
    await _until_ready(pooled, 1)
    with contextlib.suppress(StoreError):  # said so, when it failed before the answer
        await pooled.create("acme", SandboxSpec())
    await _until_none_run(pooled)


async def test_a_claim_whose_environment_fails_is_killed_and_runs_nothing(
    pooled: SandboxService, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _until_ready(pooled, 1)

    async def refused(self: DaemonClient, env: object) -> None:
        await asyncio.sleep(0.05)
        raise SandboxNotRunning("its daemon refused /init")

    monkeypatch.setattr(DaemonClient, "init", refused)
    sandbox = await pooled.create("acme", SandboxSpec(env={"SECRET": "mine"}))
    with pytest.raises((SandboxNotRunning, SandboxNotFound)):  # waits for init, fails as it
        await _run(pooled, sandbox.id, "echo ran")
    await _until_none_run(pooled)
    assert (await pooled.get("acme", sandbox.id)).state is SandboxState.FAILED


async def test_a_kill_that_interrupts_a_claims_init_ends_it_killed(
    pooled: SandboxService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18, difference 13: the claim is answered with its ``/init`` in flight; a kill
    then makes ``/init`` fail (the daemon's connection reset). That failure is the kill's,
    not the sandbox's: it ends killed (E2B's DELETE answered 404, the SDK's False)."""
    await _until_ready(pooled, 1)
    killing = asyncio.Event()
    inits: list[asyncio.Task[None]] = []
    start_init, kill = DaemonClient.start_init, LocalSandbox.kill

    def started(self: DaemonClient, env: Mapping[str, str]) -> asyncio.Task[None]:
        inits.append(start_init(self, env))
        return inits[-1]

    async def reset(self: DaemonClient, env: object) -> None:
        await killing.wait()
        raise SandboxNotRunning("its daemon cannot be reached: Connection reset by peer")

    async def killed(self: LocalSandbox) -> ExecutionResult:
        killing.set()
        await asyncio.wait(inits)  # /init fails first, as the kill's reset makes it
        return await kill(self)

    monkeypatch.setattr(DaemonClient, "start_init", started)
    monkeypatch.setattr(DaemonClient, "init", reset)
    monkeypatch.setattr(LocalSandbox, "kill", killed)
    sandbox = await pooled.create("acme", SandboxSpec())
    assert inits and not inits[0].done(), "the claim was answered before its /init"
    ended = await asyncio.wait_for(pooled.kill("acme", sandbox.id), 30)
    assert (ended.state, ended.error) == (SandboxState.KILLED, None)
    assert (await pooled.get("acme", sandbox.id)).state is SandboxState.KILLED


async def test_a_kill_waits_for_a_claims_record(pooled: SandboxService, store: GatedStore) -> None:
    await _until_ready(pooled, 1)
    store.gate.clear()
    sandbox = await pooled.create("acme", SandboxSpec())
    killing = asyncio.create_task(pooled.kill("acme", sandbox.id))
    await asyncio.sleep(0.1)  # not an order: a kill that did not wait would be done by now
    assert not killing.done() and pooled.running_count() == 1, "killed before its record"
    store.gate.set()
    assert (await asyncio.wait_for(killing, 30)).state is SandboxState.KILLED


async def _until_none_run(service: SandboxService) -> None:
    for _ in range(200):
        if service.running_count() == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("a sandbox runs unrecorded")


async def test_a_pause_right_after_a_claim_waits_for_its_init(
    pooled: SandboxService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flake of tests/e2b/test_pooled_kill.py (a pause to disk just after a pooled
    create answered 404): the claim is answered with its ``/init`` in flight, and a pause
    that froze the sandbox before its daemon had read it got it killed with the ``/init``
    unread: the reset failed the claim's environment, so the sandbox ended failed, not
    paused. Here the daemon reads ``/init`` only once a freeze was asked for (a daemon
    slow to be scheduled, as it was on a loaded host)."""
    await _until_ready(pooled, 1)
    late = _InitReadLate(monkeypatch)
    sandbox = await pooled.create("acme", SandboxSpec(env={"MINE": "1"}))
    assert late.inits and not late.inits[0].done(), "the claim was answered after its /init"
    pausing = asyncio.create_task(pooled.pause("acme", sandbox.id, memory=False))
    paused = await late.let_in(pausing)
    assert paused.sandbox.state is SandboxState.PAUSED
    assert late.frozen_before_init, "it never froze"
    assert not any(late.frozen_before_init), "frozen with the claim's /init unread"
    assert (await pooled.get("acme", sandbox.id)).state is SandboxState.PAUSED


async def test_a_state_operation_right_after_a_claim_waits_for_its_init(
    pooled: SandboxService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for what freezes through ``SandboxService.live`` (a checkpoint here; a
    rollback, a fork and an export take the same way): never with the claim's ``/init``
    unread, which the freeze's kill of a rollback or a failure would turn into a reset."""
    await _until_ready(pooled, 1)
    late = _InitReadLate(monkeypatch)
    sandbox = await pooled.create("acme", SandboxSpec(env={"MINE": "1"}))
    assert late.inits and not late.inits[0].done(), "the claim was answered after its /init"

    async def checkpointed() -> str:
        live = await pooled.live("acme", sandbox.id)
        return (await live.checkpoint()).id

    assert await late.let_in(asyncio.create_task(checkpointed()))
    assert late.frozen_before_init, "it never froze"
    assert not any(late.frozen_before_init), "frozen with the claim's /init unread"
    assert (await pooled.get("acme", sandbox.id)).state is SandboxState.RUNNING


_T = TypeVar("_T")


class _InitReadLate:
    """A daemon that reads a claim's ``/init`` only once a freeze was asked for (a daemon
    slow to be scheduled, as on a loaded host), recording whether each freeze came before
    the ``/init`` was done."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.readable = asyncio.Event()  # the daemon gets to read /init
        self.freezing = asyncio.Event()
        self.inits: list[asyncio.Task[None]] = []
        self.frozen_before_init: list[bool] = []
        start_init, init, freeze = DaemonClient.start_init, DaemonClient.init, LocalSandbox.freeze

        def started(client: DaemonClient, env: Mapping[str, str]) -> asyncio.Task[None]:
            self.inits.append(start_init(client, env))
            return self.inits[-1]

        async def late(client: DaemonClient, env: Mapping[str, str]) -> None:
            await self.readable.wait()
            await init(client, env)

        async def frozen(sandbox: LocalSandbox) -> None:
            self.frozen_before_init.append(not all(task.done() for task in self.inits))
            await freeze(sandbox)
            self.freezing.set()
            self.readable.set()

        loop, in_frozen = asyncio.get_running_loop(), LocalSandbox._in_frozen

        def frozen_for(sandbox: LocalSandbox, *args: Any, **kwargs: Any) -> Any:
            # A checkpoint's or a rollback's own freeze, in a worker thread.
            self.frozen_before_init.append(not all(task.done() for task in self.inits))
            try:
                return in_frozen(sandbox, *args, **kwargs)
            finally:
                loop.call_soon_threadsafe(self.freezing.set)
                loop.call_soon_threadsafe(self.readable.set)

        monkeypatch.setattr(DaemonClient, "start_init", started)
        monkeypatch.setattr(DaemonClient, "init", late)
        monkeypatch.setattr(LocalSandbox, "freeze", frozen)
        monkeypatch.setattr(LocalSandbox, "_in_frozen", frozen_for)

    async def let_in(self, operation: asyncio.Task[_T]) -> _T:
        """``operation``'s result. One that does not wait for the ``/init`` freezes at once,
        and only then lets the daemon read it; one that waits freezes only after it, so it
        is let in here, bounded."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.freezing.wait()), 2)
        self.readable.set()
        return await asyncio.wait_for(operation, 60)
