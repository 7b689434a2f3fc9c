"""The service layer's budget reservations: each is given back exactly once on every path
(an execution's task cancelled, its audit failing), an approved remediation is not counted
in its tenant's budget, the budget is one the composer must pass, the warm pool closes what
it drops and makes room for tenants. Fakes for the executor and the runtime: fast, and the
paths they take (a cancel mid-run, a failing audit) are hard to provoke on a real one."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from ringfence.config import Config
from ringfence.errors import RingfenceError, SandboxError, ServerAtCapacity, TooManyRequests
from ringfence.models import ExecutionRequest, ExecutionResult, SandboxSpec, Status
from ringfence.service.budget import Budget
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.executions import ExecutionService
from ringfence.service.pool import Warm, WarmPool
from ringfence.service.sandboxes import SandboxService
from ringfence.store import MemoryStore

TENANT = "acme"
EMPTY = (0, 0, 0.0)


class _Executor:
    """Runs nothing: each execution waits until ``finish`` (or forever)."""

    name = "fake"

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finish = asyncio.Event()

    def check(self, request: ExecutionRequest) -> None:
        pass

    async def execute(self, request: ExecutionRequest, **_: Any) -> ExecutionResult:
        self.started.set()
        await self.finish.wait()
        return ExecutionResult(execution_id=request.id, status=Status.SUCCEEDED, exit_code=0)

    async def get_status(self, execution_id: str) -> ExecutionResult:
        return ExecutionResult(execution_id=execution_id, status=Status.RUNNING)

    async def cancel(self, execution_id: str) -> None:
        pass

    async def aclose(self) -> None:
        self.finish.set()


class _FailingAudit:
    """An audit log whose every record of an execution's end fails."""

    def record(self, tenant: str, actor: str, action: str, *_: Any) -> None:
        if action == "execution.end":
            raise RuntimeError("the audit log is broken")


def _service(budget: Budget, audit: Any = None) -> tuple[ExecutionService, _Executor]:
    executor = _Executor()
    service = ExecutionService(MemoryStore(), executor, Config(), audit, budget=budget)  # type: ignore[arg-type]
    return service, executor


async def test_a_cancelled_execution_task_gives_back_its_reservation_and_answers() -> None:
    budget = Budget(tenant_count=1)
    service, executor = _service(budget)
    waiter = asyncio.create_task(
        service.submit(TENANT, ExecutionRequest(id="x", command=["true"]), wait=True)
    )
    await asyncio.wait_for(executor.started.wait(), 5)
    [submission] = service._live.values()
    assert submission.task is not None
    submission.task.cancel()  # as a server shutting down its loop would
    result = await asyncio.wait_for(waiter, 5)  # before the fix: the waiter hung
    assert result.status is Status.CANCELLED and result.execution_id == "x"
    assert budget.held(TENANT) == EMPTY and budget.held(None) == EMPTY
    assert not service._live
    executor.started.clear()
    again = asyncio.create_task(
        service.submit(TENANT, ExecutionRequest(id="y", command=["true"]), wait=True)
    )
    await asyncio.wait_for(executor.started.wait(), 5)  # the tenant's one place is free again
    executor.finish.set()
    assert (await asyncio.wait_for(again, 5)).status is Status.SUCCEEDED


async def test_an_execution_whose_end_cannot_be_audited_still_ends_and_gives_back() -> None:
    budget = Budget(tenant_count=1)
    service, executor = _service(budget, _FailingAudit())
    executor.finish.set()
    request = ExecutionRequest(id="x", command=["true"])
    result = await asyncio.wait_for(service.submit(TENANT, request, wait=True), 5)
    assert result.status is Status.SUCCEEDED
    assert budget.held(TENANT) == EMPTY and budget.held(None) == EMPTY


async def test_an_approved_remediation_runs_though_its_agent_filled_the_tenants_budget() -> None:
    budget = Budget(tenant_count=1, tenant_memory=1 << 40, tenant_cpus=1000)
    service, executor = _service(budget)
    filler = await service.submit(TENANT, ExecutionRequest(id="fill", command=["true"]), wait=False)
    assert filler.status is Status.PENDING
    with pytest.raises(TooManyRequests):  # the agent's own next run is refused...
        await service.submit(TENANT, ExecutionRequest(id="more", command=["true"]), wait=False)
    approved = ExecutionRequest(id="cp" + "0" * 20, command=["true"], checkpoint_id="cp" + "0" * 20)
    await service.submit(TENANT, approved, wait=False, approved=True)  # ...the approved one runs
    assert budget.held(TENANT)[0] == 1, "not counted in the tenant's budget"
    assert budget.held(None)[0] == 2, "counted in the server's totals"
    executor.finish.set()
    await service.aclose()
    assert budget.held(TENANT) == EMPTY and budget.held(None) == EMPTY


async def test_an_approved_remediation_on_a_full_host_fails_clearly() -> None:
    memory = Config().default_limits.memory
    assert memory is not None
    budget = Budget(total_memory=memory)
    service, executor = _service(budget)
    await service.submit("globex", ExecutionRequest(id="fill", command=["true"]), wait=False)
    approved = ExecutionRequest(id="cp" + "1" * 20, command=["true"], checkpoint_id="cp" + "1" * 20)
    with pytest.raises(ServerAtCapacity):  # the proposal fails with this error (approvals.md)
        await service.submit(TENANT, approved, wait=False, approved=True)
    executor.finish.set()
    await service.aclose()


@pytest.mark.parametrize("service", [ExecutionService, SandboxService])
def test_the_budget_is_one_the_composer_must_pass(service: type) -> None:
    """A service making its own budget counts apart from the other: a tenant's sandboxes and
    executions would each fill a whole budget."""
    parameter = inspect.signature(service).parameters["budget"]
    assert parameter.default is inspect.Parameter.empty
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY


class _Live:
    """A pooled sandbox that never ran anything."""

    def __init__(self, running: bool = True) -> None:
        self.running = running
        self.killed = False
        self.socket_path = Path("/nonexistent/daemon.sock")
        self._ended = asyncio.Event()

    async def ended(self) -> None:
        await self._ended.wait()

    async def kill(self) -> None:
        self.killed, self.running = True, False
        self._ended.set()


class _Runtime:
    def __init__(self) -> None:
        self.started = 0

    async def start(self, spec: Any) -> Any:
        self.started += 1
        raise RingfenceError("the fake runtime starts nothing")


def _pool(budget: Budget, runtime: Any = None) -> WarmPool:
    config = Config()
    return WarmPool(runtime, config, {"base": 1}, lambda _: config.default_image, budget)


def _pooled(pool: WarmPool, budget: Budget, live: _Live) -> Warm:
    amount = budget.amount(Config().default_limits)
    warm = Warm(live, DaemonClient("pooled", live.socket_path), budget.reserve(None, amount))  # type: ignore[arg-type]
    pool._templates["base"].ready.append(warm)
    return warm


async def test_a_claim_that_finds_an_ended_pooled_sandbox_closes_its_daemon_client() -> None:
    budget = Budget()
    pool = _pool(budget)
    warm = _pooled(pool, budget, _Live(running=False))
    assert pool.claim("base") is None
    assert budget.held(None) == EMPTY

    async def closed() -> None:
        while not warm.daemon._closed:
            await asyncio.sleep(0)

    await asyncio.wait_for(closed(), 5)


async def test_a_tenant_gets_the_room_idle_pooled_sandboxes_held_before_a_503() -> None:
    memory = Config().default_limits.memory
    assert memory is not None
    budget = Budget(total_memory=memory)  # one pooled sandbox fills the host
    runtime = _Runtime()
    pool = _pool(budget, runtime)
    live = _Live()
    _pooled(pool, budget, live)
    config = Config()
    service = SandboxService(MemoryStore(), runtime, config, pool=pool, budget=budget)  # type: ignore[arg-type]
    spec = SandboxSpec(template="base", limits={"cpus": 0.5})  # not one the pool serves
    with pytest.raises(SandboxError):  # before the fix: ServerAtCapacity
        await service.create(TENANT, spec)
    assert runtime.started == 1 and live.killed, "the idle pooled sandbox made room"
    assert budget.held(None) == EMPTY and budget.held(TENANT) == EMPTY
    budget.reserve("globex", budget.amount(config.default_limits))  # the host full again
    with pytest.raises(ServerAtCapacity):  # nothing left to evict: the clear 503
        await service.create(TENANT, spec)
    assert runtime.started == 1
