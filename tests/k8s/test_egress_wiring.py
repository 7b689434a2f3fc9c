"""Egress on the job backend, wired: the Pod runtime and the Job executor admit a Pod's
address to the replica's real proxy and release it before the Pod goes, through their own
code paths. Only the Kubernetes API is a stand-in (``fake_api``); the proxy, the policies,
the audit log and the Job's gate (run as the process it is in the Pod) are the real ones.

All of 127.0.0.0/8 is this machine's loopback, so a client bound to 127.0.0.2 is "the Pod
at 127.0.0.2" to the proxy, as a Pod's connections are on a cluster. The origins are
``tests/network``'s, under test names (nothing leaves the machine)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.kubernetes.backend import JobExecutor
from ringfence.backends.kubernetes.interactive import PodSandboxRuntime
from ringfence.backends.kubernetes.manifests import job_name
from ringfence.backends.kubernetes.replica_egress import ReplicaEgress
from ringfence.backends.kubernetes.status import GATE_CLOSED
from ringfence.compose import start_job_egress
from ringfence.config import Config
from ringfence.errors import InvalidRequest, SandboxError
from ringfence.models import ExecutionRequest, NetworkPolicy, ResourceLimits, Status
from ringfence.network.session import EgressSession, Requester, requesting
from ringfence.service.audit import AuditLog
from tests.network.conftest import TEST_NAMES, Origin, audit, audited, http_origin, raw_origin

from .fake_api import FakeCluster

__all__ = ["audit", "http_origin", "raw_origin"]

WAIT = 30  # a bound on every wait, never an expectation
READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def _policy(port: int, name: str = "allowed.test") -> NetworkPolicy:
    return NetworkPolicy.model_validate(
        {"rules": [{"domain": name, "cidr": "127.0.0.1/32", "ports": [port]}]}
    )


@dataclass
class Wired:
    cluster: FakeCluster
    executor: JobExecutor
    runtime: PodSandboxRuntime
    egress: ReplicaEgress


def _config(runtime_dir: Path, **settings: Any) -> Config:
    hosts = {name: ["127.0.0.1"] for name in TEST_NAMES}
    return Config(backend="job", runtime_dir=runtime_dir, network_hosts=hosts, **settings)


@pytest.fixture
async def wired() -> AsyncIterator[Wired]:
    """What ``ringfence serve`` builds with the job backend and RINGFENCE_POD_IP=127.0.0.1."""
    with tempfile.TemporaryDirectory(prefix="rf-") as runtime_dir:  # short: unix sockets
        config = _config(Path(runtime_dir), pod_ip="127.0.0.1")
        cluster = FakeCluster()
        executor = JobExecutor(config, cluster)  # type: ignore[arg-type]
        runtime = PodSandboxRuntime(config, cluster)  # type: ignore[arg-type]
        # Any free ports here (the real ones are fixed, >= 1024, and in the NetworkPolicy).
        free = config.model_copy(
            update={"kubernetes_egress_proxy_port": 0, "kubernetes_egress_gate_port": 0}
        )
        egress = await start_job_egress(free, executor, runtime)
        assert egress is not None
        yield Wired(cluster, executor, runtime, egress)
        await runtime.aclose()
        await executor.aclose()


async def _until(condition: Callable[[], object], what: str) -> None:
    """Wait for ``condition`` (bounded: a failure names what never happened)."""
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0.01)


async def _get(wired: Wired, source: str, url: str) -> bytes:
    """A plain-HTTP request through the replica's proxy from ``source``; the whole answer."""
    at = wired.egress.at
    reader, writer = await asyncio.open_connection(at.address, at.port, local_addr=(source, 0))
    writer.write(f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), WAIT)
    writer.close()
    return answer


def _requester(audit: AuditLog, subject: str) -> Requester:
    return Requester("acme", subject, "key-1", audit)


async def _start_sandbox(
    wired: Wired, audit: AuditLog, policy: NetworkPolicy, address: str
) -> tuple[Any, str]:
    """A sandbox started as the sandbox service starts it; its Pod made ready at ``address``."""
    spec = LaunchSpec(image="host", env={}, limits=ResourceLimits(), timeout=600, network=policy)
    with requesting(_requester(audit, "sandbox:sb-1")):
        starting = asyncio.create_task(wired.runtime.start(spec))
    await _until(lambda: any(k == "Pod" for k, _ in wired.cluster.objects), "the Pod")
    name = wired.cluster.pod("rf-s-")["metadata"]["name"]
    assert wired.egress.proxy.session("acme", "sandbox:sb-1") is None, "not before ready"
    wired.cluster.set_pod(name, podIP=address, **READY)
    return await asyncio.wait_for(starting, WAIT), name


# -- interactive sandboxes (Pods) ------------------------------------------------------------


async def test_a_sandbox_pod_gets_its_policy_when_ready_and_loses_it_before_its_delete(
    wired: Wired, http_origin: Origin, raw_origin: Origin, audit: AuditLog
) -> None:
    origin = http_origin.port
    sandbox, _ = await _start_sandbox(wired, audit, _policy(origin), "127.0.0.2")
    env = {e["name"]: e["value"] for e in wired.cluster.pod()["spec"]["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == f"http://127.0.0.1:{wired.egress.at.port}"
    assert b"hello from origin" in await _get(wired, "127.0.0.2", f"http://allowed.test:{origin}/")
    denied = await _get(wired, "127.0.0.2", f"http://other.test:{origin}/")
    assert denied.startswith(b"HTTP/1.1 403 egress denied by Ringfence")
    stranger = await _get(wired, "127.0.0.3", f"http://allowed.test:{origin}/")
    assert b"no sandbox of this replica" in stranger.split(b"\r\n")[0]

    # A tunnel open when the sandbox is killed: cut, and the address released first.
    released_at_delete: list[bool] = []
    wired.cluster.on_delete = lambda kind, _: released_at_delete.append(
        wired.egress.proxy.session_at("127.0.0.2") is None
    )
    wired.egress.proxy.session_at("127.0.0.2").set_policy(_policy(raw_origin.port))  # type: ignore[union-attr]
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", wired.egress.at.port, local_addr=("127.0.0.2", 0)
    )
    writer.write(f"CONNECT allowed.test:{raw_origin.port} HTTP/1.1\r\n\r\n".encode())
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)).startswith(b"HTTP/1.1 200")
    assert (await sandbox.kill()).status is Status.CANCELLED
    assert released_at_delete == [True]
    assert await asyncio.wait_for(reader.read(), WAIT) == b"", "the tunnel was cut"
    writer.close()
    after = await _get(wired, "127.0.0.2", f"http://allowed.test:{origin}/")
    assert b"no sandbox of this replica" in after.split(b"\r\n")[0]
    assert http_origin.connections == 1
    records = await audited(audit, "network.connect")
    assert {(r.target, r.details["host"], r.outcome) for r in records} >= {
        ("sandbox:sb-1", "allowed.test", "allowed"), ("sandbox:sb-1", "other.test", "denied"),
    }  # fmt: skip


async def test_set_network_finds_the_pods_session_where_serve_points_the_service(
    wired: Wired, http_origin: Origin, audit: AuditLog
) -> None:
    """``SandboxService.set_network`` looks sessions up through ``executor.egress`` (serve
    hands it over as ``egress_gateway``): a change there holds from the next connection."""
    origin = http_origin.port
    await _start_sandbox(wired, audit, _policy(origin), "127.0.0.2")
    gateway = wired.executor.egress
    assert gateway is wired.egress.proxy
    assert gateway.session("globex", "sandbox:sb-1") is None  # another tenant's: not found
    session = gateway.session("acme", "sandbox:sb-1")
    assert session is not None
    session.set_policy(_policy(origin, "other.test"))
    assert b"hello from origin" in await _get(wired, "127.0.0.2", f"http://other.test:{origin}/")
    assert b" 403 " in (await _get(wired, "127.0.0.2", f"http://allowed.test:{origin}/"))[:16]


async def test_a_pod_deleted_by_someone_else_loses_its_address_at_the_first_sign(
    wired: Wired, http_origin: Origin, audit: AuditLog
) -> None:
    sandbox, name = await _start_sandbox(wired, audit, _policy(http_origin.port), "127.0.0.2")
    # Being deleted (still terminating, its address still its own): released already.
    wired.cluster.set_pod(name, podIP="127.0.0.2", deletionTimestamp="2026-01-01T00:00:00Z",
                          **READY)  # fmt: skip
    await _until(lambda: wired.egress.proxy.session_at("127.0.0.2") is None, "the release")
    wired.cluster.remove("Pod", name)
    result = await asyncio.wait_for(sandbox.ended(), WAIT)
    assert result.status is Status.FAILED


async def test_a_pod_that_ends_by_itself_loses_its_address_before_it_is_deleted(
    wired: Wired, http_origin: Origin, audit: AuditLog
) -> None:
    sandbox, name = await _start_sandbox(wired, audit, _policy(http_origin.port), "127.0.0.2")
    released_at_delete: list[bool] = []
    wired.cluster.on_delete = lambda kind, _: released_at_delete.append(
        wired.egress.proxy.session_at("127.0.0.2") is None
    )
    ended = {"name": "sandbox", "state": {"terminated": {"exitCode": 3}}}
    wired.cluster.set_pod(name, phase="Failed", podIP="127.0.0.2", containerStatuses=[ended])
    assert (await asyncio.wait_for(sandbox.ended(), WAIT)).status is Status.FAILED
    assert released_at_delete == [True]


async def test_an_address_still_anothers_fails_the_start_and_removes_the_pod(
    wired: Wired, http_origin: Origin, audit: AuditLog
) -> None:
    other = EgressSession(_requester(audit, "sandbox:old"), _policy(http_origin.port))
    wired.egress.proxy.register("127.0.0.2", other)  # e.g. a Pod whose end was not seen yet
    with pytest.raises(SandboxError, match="still the address of another sandbox"):
        await _start_sandbox(wired, audit, _policy(http_origin.port), "127.0.0.2")
    assert [kind for kind, _ in wired.cluster.deleted] == ["Pod"]
    assert wired.egress.proxy.session_at("127.0.0.2") is other, "never overwritten"


async def test_without_the_replicas_pod_ip_rules_stay_refused(tmp_path: Path) -> None:
    config = _config(tmp_path)
    cluster = FakeCluster()
    executor = JobExecutor(config, cluster)  # type: ignore[arg-type]
    runtime = PodSandboxRuntime(config, cluster)  # type: ignore[arg-type]
    try:
        assert await start_job_egress(config, executor, runtime) is None
        assert executor.egress is None
        request = ExecutionRequest(id="x-1", command=["true"], network=_policy(443))
        with pytest.raises(InvalidRequest, match="does not enforce egress rules"):
            executor.check(request)
        spec = LaunchSpec(image="host", env={}, limits=ResourceLimits(), timeout=60,
                          network=_policy(443))  # fmt: skip
        with pytest.raises(InvalidRequest, match="does not enforce egress rules"):
            await runtime.start(spec)
        assert not cluster.objects, "nothing was created"
        intercepting = _config(tmp_path, pod_ip="127.0.0.1", network_intercept=True)
        with pytest.raises(InvalidRequest, match="cannot intercept TLS"):
            await start_job_egress(intercepting, executor, runtime)
    finally:
        await runtime.aclose()
        await executor.aclose()


# -- one-shot executions (Jobs) --------------------------------------------------------------


async def _gate(command: list[str], *, owner: str | None = None, seconds: str | None = None
                ) -> tuple[int, bytes]:  # fmt: skip
    """Run the Job's gate as its init container runs it (the Pod's address: 127.0.0.1)."""
    command = list(command)
    if owner is not None:
        command[-2] = owner
    if seconds is not None:
        command[-1] = seconds
    process = await asyncio.create_subprocess_exec(
        *command, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL
    )
    _, stderr = await asyncio.wait_for(process.communicate(), WAIT + 70)
    assert process.returncode is not None
    return process.returncode, stderr


async def _start_job(wired: Wired, audit: AuditLog, execution: str, policy: NetworkPolicy
                     ) -> tuple[asyncio.Task[Any], str, list[str]]:  # fmt: skip
    request = ExecutionRequest(id=execution, command=["true"], network=policy)
    with requesting(_requester(audit, f"execution:{execution}")):
        running = asyncio.create_task(wired.executor.execute(request))
    name = job_name(execution)
    await _until(lambda: ("Pod", f"{name}-pod") in wired.cluster.objects, "the Job's Pod")
    template = wired.cluster.objects[("Job", name)]["spec"]["template"]["spec"]
    (gate,) = template["initContainers"]
    return running, name, gate["command"]


async def test_a_jobs_command_waits_for_its_pod_to_be_admitted_and_gets_its_policy(
    wired: Wired, http_origin: Origin, audit: AuditLog
) -> None:
    origin = http_origin.port
    running, name, gate = await _start_job(wired, audit, "x-1", _policy(origin))
    # The Pod has no address yet: the gate stays shut (its bound shortened to 1 s here).
    code, stderr = await _gate(gate, seconds="1")
    assert code == 1 and b"did not admit this pod within 1 s" in stderr
    wired.cluster.set_pod(f"{name}-pod", phase="Pending", podIP="127.0.0.1")
    await _until(lambda: wired.egress.proxy.session_at("127.0.0.1"), "the admission")
    # Admitted for this execution, not for another one that would name itself.
    assert (await _gate(gate, owner="execution:x-2", seconds="1"))[0] == 1
    assert (await _gate(gate))[0] == 0
    assert b"hello from origin" in await _get(wired, "127.0.0.1", f"http://allowed.test:{origin}/")
    assert b" 403 " in (await _get(wired, "127.0.0.1", f"http://other.test:{origin}/"))[:16]

    ended = {"name": "sandbox", "state": {"terminated": {"exitCode": 0}}}
    wired.cluster.set_pod(f"{name}-pod", phase="Succeeded", podIP="127.0.0.1",
                          containerStatuses=[ended])  # fmt: skip
    await _until(lambda: wired.egress.proxy.session_at("127.0.0.1") is None, "the release")
    wired.cluster.set_job(name, conditions=[{"type": "Complete", "status": "True"}])
    result = await asyncio.wait_for(running, WAIT)
    assert result.status is Status.SUCCEEDED
    records = await audited(audit, "network.connect")
    assert {(r.target, r.details["host"], r.outcome) for r in records} == {
        ("execution:x-1", "allowed.test", "allowed"), ("execution:x-1", "other.test", "denied"),
    }  # fmt: skip


async def test_a_cancelled_job_loses_its_address_before_the_job_is_deleted(
    wired: Wired, http_origin: Origin, audit: AuditLog
) -> None:
    running, name, _ = await _start_job(wired, audit, "x-2", _policy(http_origin.port))
    wired.cluster.set_pod(f"{name}-pod", phase="Running", podIP="127.0.0.2")
    await _until(lambda: wired.egress.proxy.session_at("127.0.0.2"), "the admission")
    released_at_delete: list[bool] = []
    wired.cluster.on_delete = lambda kind, _: released_at_delete.append(
        wired.egress.proxy.session_at("127.0.0.2") is None
    )
    assert (await wired.executor.cancel("x-2")).status is Status.CANCELLED
    assert released_at_delete and all(released_at_delete)
    assert (await asyncio.wait_for(running, WAIT)).status is Status.CANCELLED


async def test_cancelling_a_job_someone_already_deleted_ends_at_once(
    wired: Wired, http_origin: Origin, audit: AuditLog
) -> None:
    running, name, _ = await _start_job(wired, audit, "x-9", _policy(http_origin.port))
    wired.cluster._delete("Job", name)  # gone before the cancel: no watch will see it go
    cancelled = await asyncio.wait_for(wired.executor.cancel("x-9"), WAIT)
    assert cancelled.status is Status.CANCELLED
    assert (await asyncio.wait_for(running, WAIT)).status is Status.CANCELLED


async def test_a_gate_that_never_opened_fails_the_execution_saying_so(
    wired: Wired, http_origin: Origin, audit: AuditLog
) -> None:
    running, name, _ = await _start_job(wired, audit, "x-3", _policy(http_origin.port))
    gate = {"name": "egress-gate", "state": {"terminated": {"exitCode": 1}}}
    waiting = {"name": "sandbox", "state": {"waiting": {"reason": "PodInitializing"}}}
    wired.cluster.set_pod(f"{name}-pod", phase="Failed", initContainerStatuses=[gate],
                          containerStatuses=[waiting])  # fmt: skip
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    wired.cluster.set_job(name, conditions=[failed])
    result = await asyncio.wait_for(running, WAIT)
    assert (result.status, result.error) == (Status.FAILED, GATE_CLOSED)


async def test_a_job_whose_address_is_still_anothers_never_runs(
    wired: Wired, http_origin: Origin, audit: AuditLog
) -> None:
    other = EgressSession(_requester(audit, "sandbox:old"), _policy(http_origin.port))
    wired.egress.proxy.register("127.0.0.2", other)
    running, name, _ = await _start_job(wired, audit, "x-4", _policy(http_origin.port))
    wired.cluster.set_pod(f"{name}-pod", phase="Pending", podIP="127.0.0.2")
    result = await asyncio.wait_for(running, WAIT)
    assert result.status is Status.FAILED
    assert result.error is not None and "still the address of another sandbox" in result.error
    assert ("Job", name) in wired.cluster.deleted
    assert wired.egress.proxy.session_at("127.0.0.2") is other
