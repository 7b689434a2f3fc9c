"""A networked template's pooled sandbox (deny-all until claimed) on real sandboxes: what a
process started in the pool tries before the claim (DNS, HTTP through the proxy, a direct
connection) is refused, a process started there then goes out under the claimer's
policy, and the claimer's audit record holds everything its sandbox
asked after the claim, also what was asked (and refused, unrecorded) before it."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.config import Config
from ringfence.models import NetworkPolicy, SandboxSpec
from ringfence.network.gateway import EgressGateway
from ringfence.service.audit import AuditLog
from ringfence.service.budget import Budget
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.pool import Warm, WarmPool
from ringfence.service.sandboxes import SandboxService, template_image
from ringfence.store import MemoryStore
from tests.network.conftest import Origin, audited

# The origins are on the host's loopback: the operator lets tenants name it here.
_CONFIG = Config(network_internal_cidrs=["127.0.0.1/32"])
_RESOLVE = (
    "python3 -c 'import socket, sys\ntry:\n socket.getaddrinfo(sys.argv[1], 80)\n"
    ' print("resolved")\nexcept socket.gaierror:\n print("refused")\' {name}'
)


async def _run(daemon: DaemonClient, script: str) -> str:
    body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", script]}}).encode()
    response = await daemon.send(
        "POST",
        "/process.Process/Start",
        headers={"content-type": "application/connect+json"},
        content=struct.pack(">BI", 0, len(body)) + body,
    )
    raw, out = await response.aread(), b""
    while raw:
        _, length = struct.unpack(">BI", raw[:5])
        data = json.loads(raw[5 : 5 + length]).get("event", {}).get("data", {})
        raw = raw[5 + length :]
        if "stdout" in data:
            out += base64.b64decode(data["stdout"])
    return out.decode()


@pytest.fixture
async def pooled(
    local_host: object, gateway: EgressGateway, audit: AuditLog, http_origin: Origin
) -> AsyncIterator[tuple[SandboxService, list[str]]]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    executor = LocalExecutor(_CONFIG, host=local_host, egress=gateway)
    runtime = LocalSandboxRuntime(executor, _CONFIG)
    before: list[str] = []

    async def prepare(warm: Warm) -> None:
        # What a pooled process asks before anyone claims it: refused, recorded nowhere.
        before.append(await _run(warm.daemon, _RESOLVE.format(name="denied.test")))
        before.append(await _run(warm.daemon, _RESOLVE.format(name="allowed.test")))
        # Through the proxy (its variables are set: Chromium's way out) and around it.
        url = f"http://allowed.test:{http_origin.port}/"
        before.append(
            await _run(warm.daemon, f"curl -s -m 10 -o /dev/null -w %{{http_code}} {url}")
        )
        around = f"curl -s -m 10 --noproxy '*' http://127.0.0.1:{http_origin.port}/ || echo failed"
        before.append(await _run(warm.daemon, around))
        # A process that outlives the claim, as the pool's Chromium does: its requests are
        # the pool's (refused) before the claim and the claimer's after it.
        loop = (
            f"while :; do curl -s -m 5 -o /dev/null -w '%{{http_code}}\\n' {url}; sleep 0.2; done"
        )
        await _run(warm.daemon, f'setsid sh -c "{loop}" >> /tmp/loop.log 2>&1 < /dev/null &')
        for _ in range(200):
            if "403" in await _run(warm.daemon, "cat /tmp/loop.log"):
                break
            await asyncio.sleep(0.05)

    pool = WarmPool(
        runtime, _CONFIG, {"base": 1}, lambda name: template_image(name, _CONFIG),
        prepare={"base": prepare}, networked=["base"],
    )  # fmt: skip
    service = SandboxService(
        MemoryStore(), runtime, _CONFIG, audit, pool, budget=Budget.for_server(_CONFIG),
        egress_gateway=gateway,
    )  # fmt: skip
    service.start()
    try:
        yield service, before
    finally:
        await service.aclose()
        await executor.aclose()


async def test_the_claimers_record_holds_what_its_sandbox_asked_also_before_the_claim(
    pooled: tuple[SandboxService, list[str]], audit: AuditLog, http_origin: Origin
) -> None:
    service, before = pooled
    for _ in range(600):
        if service.pool_stats()["base"].size == 1:
            break
        await asyncio.sleep(0.05)
    assert before == ["refused\n", "refused\n", "403", "failed\n"], "deny-all until the claim"
    assert http_origin.connections == 0, "nothing of the pool reached the origin"
    assert await audited(audit) == [], "a pooled sandbox's egress is nobody's record"
    policy = NetworkPolicy.model_validate(
        {"rules": [{"domain": "allowed.test", "cidr": "127.0.0.1/32",
                    "ports": [http_origin.port]}]}
    )  # fmt: skip
    sandbox = await service.create("acme", SandboxSpec(network=policy, timeout=60))
    assert service.pool_stats()["base"].hits == 1
    daemon = await service.daemon("acme", sandbox.id)
    assert await _run(daemon, _RESOLVE.format(name="allowed.test")) == "resolved\n"
    assert await _run(daemon, _RESOLVE.format(name="denied.test")) == "refused\n"
    fetched = await _run(daemon, f"curl -sS -m 20 http://allowed.test:{http_origin.port}/")
    assert "hello from origin" in fetched
    for _ in range(400):  # the pool's process, started before the claim, goes out now
        codes = (await _run(daemon, "cat /tmp/loop.log")).split()
        if "200" in codes:
            break
        await asyncio.sleep(0.05)
    assert codes[0] == "403" and "200" in codes, codes
    assert set(codes) <= {"403", "200"}, codes
    records = await audited(audit, "network.")
    mine = [r for r in records if r.target == f"sandbox:{sandbox.id}"]
    assert mine and all(r.tenant == "acme" for r in records), records
    questions = {(r.details.get("name"), r.outcome) for r in mine if r.action == "network.dns"}
    # Asked and refused in the pool too: the pool's memory of it is not the claimer's.
    assert ("denied.test", "denied") in questions, questions
    assert ("allowed.test", "allowed") in questions, questions
