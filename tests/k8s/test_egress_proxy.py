"""The control plane's egress proxy for sandbox Pods tells sandboxes apart by source address.

Run on this machine's loopback: all of 127.0.0.0/8 is local, so a client bound to 127.0.0.2
is "the Pod at 127.0.0.2" to the proxy, as a Pod's connection is on a cluster. The origins
and the audit log are ``tests/network``'s (test names, nothing leaves the machine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ringfence.backends.kubernetes.egress_proxy import PodEgressProxy, pod_address
from ringfence.models import NetworkPolicy
from ringfence.network import Resolver
from ringfence.network.session import EgressSession, Requester
from ringfence.policy.egress import OwnEndpoints
from ringfence.service.audit import AuditLog
from tests.network.conftest import TEST_NAMES, Origin, audit, audited, http_origin, raw_origin

__all__ = ["audit", "http_origin", "raw_origin"]

WAIT = 30  # a bound on every wait, never an expectation


def _session(audit: AuditLog, sandbox: str, port: int, name: str = "allowed.test") -> EgressSession:
    policy = NetworkPolicy.model_validate(
        {"rules": [{"domain": name, "cidr": "127.0.0.1/32", "ports": [port]}]}
    )
    return EgressSession(Requester("acme", f"sandbox:{sandbox}", "key-1", audit), policy)


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[PodEgressProxy, int]]:
    egress = PodEgressProxy(
        Resolver({n: ["127.0.0.1"] for n in TEST_NAMES}, system=False), own=OwnEndpoints()
    )
    port = await egress.start("127.0.0.1", 0)
    yield egress, port
    await egress.aclose()


async def _get(proxy_port: int, source: str, url: str) -> bytes:
    """A plain-HTTP request through the proxy from ``source``; the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port, local_addr=(source, 0))
    writer.write(f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), WAIT)
    writer.close()
    return answer


async def test_each_pod_address_gets_its_own_sandboxs_policy(
    proxy: tuple[PodEgressProxy, int], http_origin: Origin, audit: AuditLog
) -> None:
    egress, port = proxy
    origin = http_origin.port
    egress.register("127.0.0.2", _session(audit, "sb-a", origin, "allowed.test"))
    egress.register("127.0.0.4", _session(audit, "sb-b", origin, "other.test"))
    assert b"hello from origin" in await _get(port, "127.0.0.2", f"http://allowed.test:{origin}/")
    refused = await _get(port, "127.0.0.2", f"http://other.test:{origin}/")
    assert refused.startswith(b"HTTP/1.1 403 egress denied by Ringfence")
    assert b"hello from origin" in await _get(port, "127.0.0.4", f"http://other.test:{origin}/")
    assert b"403" in (await _get(port, "127.0.0.4", f"http://allowed.test:{origin}/"))[:20]
    assert http_origin.connections == 2
    records = await audited(audit, "network.connect")
    seen = sorted((r.target, r.outcome, r.details["host"]) for r in records)
    assert seen == [
        ("sandbox:sb-a", "allowed", "allowed.test"), ("sandbox:sb-a", "denied", "other.test"),
        ("sandbox:sb-b", "allowed", "other.test"), ("sandbox:sb-b", "denied", "allowed.test"),
    ]  # fmt: skip


async def test_an_address_that_is_no_sandbox_of_this_replica_is_refused(
    proxy: tuple[PodEgressProxy, int], http_origin: Origin, audit: AuditLog
) -> None:
    egress, port = proxy
    egress.register("127.0.0.2", _session(audit, "sb-a", http_origin.port))
    url = f"http://allowed.test:{http_origin.port}/"
    for stranger in ("127.0.0.3", "127.0.0.1"):  # another Pod; the control plane's own
        answer = await _get(port, stranger, url)
        assert answer.startswith(b"HTTP/1.1 403 egress denied by Ringfence: this address is no")
    assert http_origin.connections == 0


async def test_an_unregistered_pod_is_refused_and_its_open_tunnels_are_cut(
    proxy: tuple[PodEgressProxy, int], raw_origin: Origin, http_origin: Origin, audit: AuditLog
) -> None:
    egress, port = proxy
    session = _session(audit, "sb-a", raw_origin.port)
    egress.register("127.0.0.2", session)
    assert egress.session_at("127.0.0.2") is session
    assert egress.session("acme", "sandbox:sb-a") is session  # where set_network finds it
    assert egress.session("globex", "sandbox:sb-a") is None
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
    writer.write(f"CONNECT allowed.test:{raw_origin.port} HTTP/1.1\r\n\r\n".encode())
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)).startswith(b"HTTP/1.1 200")
    await egress.unregister("127.0.0.2")
    assert await asyncio.wait_for(reader.read(), WAIT) == b"", "the tunnel was cut"
    writer.close()
    assert egress.session_at("127.0.0.2") is None
    assert egress.session("acme", "sandbox:sb-a") is None
    url = f"http://allowed.test:{raw_origin.port}/"
    assert (await _get(port, "127.0.0.2", url)).startswith(b"HTTP/1.1 403")
    await egress.unregister("127.0.0.2")  # twice is fine


async def test_an_address_still_registered_cannot_be_given_to_another_sandbox(
    proxy: tuple[PodEgressProxy, int], audit: AuditLog
) -> None:
    egress, _ = proxy
    first = _session(audit, "sb-a", 80)
    egress.register("127.0.0.2", first)
    with pytest.raises(ValueError, match="another sandbox"):
        egress.register("::ffff:127.0.0.2", _session(audit, "sb-b", 80))
    assert egress.session_at("127.0.0.2") is first
    with pytest.raises(ValueError):
        egress.register("pod.example", first)


def test_addresses_are_compared_as_addresses() -> None:
    assert pod_address("::ffff:10.1.2.3") == pod_address("10.1.2.3")
    assert pod_address("fe80::1%eth0") == pod_address("fe80::1")
    assert pod_address("fd00::5") != pod_address("10.0.0.5")


async def test_listening_on_every_address_as_in_a_pod(http_origin: Origin, audit: AuditLog) -> None:
    egress = PodEgressProxy(
        Resolver({n: ["127.0.0.1"] for n in TEST_NAMES}, system=False), own=OwnEndpoints()
    )
    port = await egress.start("0.0.0.0", 0)  # every interface, as in the control plane's Pod
    try:
        egress.register("127.0.0.2", _session(audit, "sb-a", http_origin.port))
        url = f"http://allowed.test:{http_origin.port}/"
        assert b"hello from origin" in await _get(port, "127.0.0.2", url)
        assert (await _get(port, "127.0.0.3", url)).startswith(b"HTTP/1.1 403")
    finally:
        await egress.aclose()


async def _ask_gate(port: int, source: str, line: bytes) -> bytes:
    """The gate's answer to ``line`` from ``source``; b"" when it closed without one."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(line)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), WAIT)
    except ConnectionResetError:  # closed with our question unread
        return b""
    finally:
        writer.close()


async def test_the_gate_opens_only_for_the_admitted_address_and_its_owner(
    proxy: tuple[PodEgressProxy, int], audit: AuditLog
) -> None:
    egress, _ = proxy
    gate = await egress.start_gate("127.0.0.1", 0)
    egress.register("127.0.0.2", _session(audit, "sb-a", 80), "execution:x-1")
    assert await _ask_gate(gate, "127.0.0.2", b"execution:x-1\n") == b"open\n"
    assert await _ask_gate(gate, "127.0.0.2", b"execution:x-2\n") == b"wait\n"  # not its own
    assert await _ask_gate(gate, "127.0.0.3", b"execution:x-1\n") == b"wait\n"  # another Pod
    assert await _ask_gate(gate, "127.0.0.2", b"\n") == b"wait\n"
    assert await _ask_gate(gate, "127.0.0.2", b"x" * 4096 + b"\n") == b""  # too long: closed
    await egress.unregister("127.0.0.2")
    assert await _ask_gate(gate, "127.0.0.2", b"execution:x-1\n") == b"wait\n"


async def test_the_gate_lets_no_address_hoard_connections(
    proxy: tuple[PodEgressProxy, int], audit: AuditLog
) -> None:
    egress, _ = proxy
    gate = await egress.start_gate("127.0.0.1", 0)
    egress.register("127.0.0.2", _session(audit, "sb-a", 80), "execution:x-1")
    silent = [
        await asyncio.open_connection("127.0.0.1", gate, local_addr=("127.0.0.2", 0))
        for _ in range(4)
    ]
    # The fifth question while four hang silent: closed unanswered; another address is not
    # held up by it.
    assert await _ask_gate(gate, "127.0.0.2", b"execution:x-1\n") == b""
    assert await _ask_gate(gate, "127.0.0.4", b"execution:x-1\n") == b"wait\n"
    for _, writer in silent:
        writer.close()
    async with asyncio.timeout(WAIT):  # the four are answered (closed) once they end
        while await _ask_gate(gate, "127.0.0.2", b"execution:x-1\n") != b"open\n":
            await asyncio.sleep(0.01)
