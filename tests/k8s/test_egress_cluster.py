"""Egress on a real cluster: a Job and a sandbox Pod with a policy reach only what it allows,
through this process's proxy, and a change holds at once. Run only when KUBECONFIG is set.

No Kubernetes cluster can run on the machines these tests are developed on, so this module
is part of the one group CI may skip. The Pods must reach this process as they reach a
control-plane replica: run the tests in a Pod of the control plane's namespace that carries
its label (``app.kubernetes.io/name=ringfence-control-plane``, which the egress
NetworkPolicy admits), with ``RINGFENCE_POD_IP`` from the downward API, after
``ringfence k8s render | kubectl apply -f -``, on a CNI that enforces NetworkPolicy.
Without RINGFENCE_POD_IP, the address this machine uses towards the API server is taken
(e.g. kind on Linux, where a Pod reaches the host; the direct-connection test then fails on
a CNI that enforces policy only if the proxy is unreachable too, which the others show).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import textwrap
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.kubernetes._client import Cluster
from ringfence.backends.kubernetes.backend import JobExecutor
from ringfence.backends.kubernetes.interactive import PodSandboxRuntime
from ringfence.backends.kubernetes.replica_egress import ReplicaEgress
from ringfence.compose import start_job_egress
from ringfence.config import Config
from ringfence.models import ExecutionRequest, NetworkPolicy, ResourceLimits, Status
from ringfence.network.session import Requester, requesting
from ringfence.service.daemon_client import DaemonClient

pytestmark = pytest.mark.skipif(
    not os.environ.get("KUBECONFIG"),
    reason="no Kubernetes cluster can run on these machines: set KUBECONFIG to a real "
    "cluster (with ringfence k8s render applied) to run the egress end-to-end tests",
)

WAIT = 180  # a bound on every wait (image pulls included), never an expectation

# What the sandbox runs: each line says what happened to one attempt.
PROBE = textwrap.dedent(
    """\
    import socket, sys, urllib.request, urllib.error
    port, direct = int(sys.argv[1]), sys.argv[2]
    for name in ("allowed.test", "denied.test"):
        try:
            body = urllib.request.urlopen(f"http://{name}:{port}/", timeout=20).read()
            print(name, "reached", body.decode().strip())
        except urllib.error.HTTPError as exc:
            print(name, "refused", exc.code)
        except OSError as exc:
            print(name, "failed", type(exc).__name__)
    try:
        socket.create_connection((direct, port), timeout=5).close()
        print("direct reached")
    except OSError:
        print("direct failed")
    try:
        socket.getaddrinfo("kubernetes.default.svc.cluster.local", 443)
        print("dns answered")
    except OSError:
        print("dns failed")
    """
)


def _address(cluster: Cluster) -> str:
    """Where the sandbox Pods reach this process."""
    if address := os.environ.get("RINGFENCE_POD_IP"):
        return address
    server = urlsplit(cluster.api.configuration.host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((server.hostname or "127.0.0.1", server.port or 443))
        return str(probe.getsockname()[0])


@dataclass
class Replica:
    executor: JobExecutor
    runtime: PodSandboxRuntime
    egress: ReplicaEgress
    address: str
    origin_port: int
    origin_hits: list[bytes]

    def policy(self, name: str) -> NetworkPolicy:
        return NetworkPolicy.model_validate(
            {"rules": [{"domain": name, "cidr": f"{self.address}/32", "ports": [self.origin_port]}]}
        )


@pytest.fixture
async def replica(tmp_path: Any) -> AsyncIterator[Replica]:
    cluster = Cluster()
    address = _address(cluster)
    hits: list[bytes] = []

    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        hits.append(head)
        body = b"hello from origin\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(origin, address, 0)
    hosts = {"allowed.test": [address], "denied.test": [address]}
    config = Config(backend="job", pod_ip=address, network_hosts=hosts, runtime_dir=tmp_path,
                    ttl_seconds_after_finished=60)  # fmt: skip
    executor = JobExecutor(config, cluster)
    runtime = PodSandboxRuntime(config, executor.cluster)
    egress = await start_job_egress(config, executor, runtime)
    assert egress is not None
    port = int(server.sockets[0].getsockname()[1])
    yield Replica(executor, runtime, egress, address, port, hits)
    await runtime.aclose()
    await executor.aclose()
    server.close()


def _lines(output: str) -> set[str]:
    return {line.strip() for line in output.splitlines() if line.strip()}


async def test_a_job_reaches_only_what_its_policy_allows(replica: Replica) -> None:
    execution = f"e2e-egress-{uuid.uuid4().hex[:8]}"
    request = ExecutionRequest(
        id=execution, timeout=120, network=replica.policy("allowed.test"),
        command=["python3", "-c", PROBE, str(replica.origin_port), replica.address],
    )  # fmt: skip
    with requesting(Requester("e2e", f"execution:{execution}")):
        result = await asyncio.wait_for(replica.executor.execute(request), WAIT)
    assert result.status is Status.SUCCEEDED, result
    assert _lines(result.logs) >= {
        "allowed.test reached hello from origin", "denied.test refused 403",
        "direct failed", "dns failed",
    }, result.logs  # fmt: skip
    assert len(replica.origin_hits) == 1, "only the allowed request reached the origin"
    assert replica.egress.proxy.session("e2e", f"execution:{execution}") is None, "released"


async def _run(client: DaemonClient, argv: list[str]) -> str:
    """Run ``argv`` in the sandbox through its daemon; what it printed."""
    payload = json.dumps({"process": {"cmd": argv[0], "args": argv[1:]}}).encode()
    response = await client.send(
        "POST", "/process.Process/Start", headers={"content-type": "application/connect+json"},
        content=struct.pack(">BI", 0, len(payload)) + payload,
    )  # fmt: skip
    body = await response.aread()
    assert response.status_code == 200, body
    printed = ""
    while body:
        flags, length = struct.unpack(">BI", body[:5])
        message, body = json.loads(body[5 : 5 + length]), body[5 + length :]
        data = {} if flags & 2 else message["event"].get("data", {})
        printed += base64.b64decode(data.get("stdout", "")).decode()
    return printed


async def test_a_sandbox_pods_policy_holds_and_changes_live(replica: Replica) -> None:
    spec = LaunchSpec(image="host", env={}, timeout=300, network=replica.policy("allowed.test"),
                      limits=ResourceLimits(memory=256 << 20, cpus=0.5, disk=64 << 20))  # fmt: skip
    with requesting(Requester("e2e", "sandbox:e2e-egress")):
        sandbox = await asyncio.wait_for(replica.runtime.start(spec), WAIT)
    client = DaemonClient("e2e", sandbox.socket_path)
    probe = ["python3", "-c", PROBE, str(replica.origin_port), replica.address]
    try:
        await client.health(30)
        assert _lines(await _run(client, probe)) >= {
            "allowed.test reached hello from origin", "denied.test refused 403",
            "direct failed", "dns failed",
        }  # fmt: skip
        session = replica.executor.egress.session("e2e", "sandbox:e2e-egress")  # type: ignore[union-attr]
        assert session is not None, "where set_network finds it"
        session.set_policy(replica.policy("denied.test"))
        assert _lines(await _run(client, probe)) >= {
            "allowed.test refused 403", "denied.test reached hello from origin",
        }  # fmt: skip
    finally:
        await client.aclose()
        assert (await sandbox.kill()).status is Status.CANCELLED
    assert replica.egress.proxy.session("e2e", "sandbox:e2e-egress") is None, "released"
    assert len(replica.origin_hits) == 2
