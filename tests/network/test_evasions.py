"""Attacks from the egress security review: each one got past the proxy or the policy
before its fix. Real sandboxes talk to the proxy; the origins are on the host's loopback
and must never be reached where the policy does not allow them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.probe import Host
from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import EgressRule, NetworkMode, NetworkPolicy
from ringfence.network import Requester, Resolver
from ringfence.network.gateway import LISTENING, EgressGateway
from ringfence.network.proxy import serve_client
from ringfence.network.session import EgressSession
from ringfence.policy.egress import Address, OwnEndpoints, own_endpoints
from ringfence.policy.network import check_tenant_policy
from ringfence.service.audit import AuditLog
from tests.integration._attack_helpers import RootInside, python, reported
from tests.network.conftest import Origin, audited
from tests.network.test_egress import rules, run

# Send raw request heads to the proxy; report the status line of each answer.
_RAW = """
import json, socket, sys
out = []
for head in json.loads(sys.argv[1]):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(head.encode("latin-1"))
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    out.append(data.decode("latin-1"))
report(out)
"""


def raw_requests(*heads: str) -> list[str]:
    import json

    return python(_RAW, json.dumps(list(heads)))


def status(answer: str) -> str:
    return answer.split("\r\n", 1)[0]


# -- C1: IPv4 addresses written as IPv6 ---------------------------------------------------------

# Each reaches an IPv4 address (the host's loopback, the metadata service) by another name.
EMBEDDED_IPV4 = (
    "::ffff:0.0.0.0/96", "::ffff:127.0.0.1/128", "::ffff:169.254.169.254/128",
    "::ffff:7f00:0/104", "64:ff9b::/96", "64:ff9b::7f00:1/128", "64:ff9b:1::/48",
    "2002::/16", "2002:7f00:1::/48", "::/96", "::127.0.0.1/128",
)  # fmt: skip
# Special-purpose ranges a tenant may not name either.
OTHER_INTERNAL = ("192.0.0.0/24", "198.18.0.0/15", "fec0::/10", "168.63.129.16/32")


@pytest.mark.parametrize("cidr", EMBEDDED_IPV4 + OTHER_INTERNAL)
def test_a_tenant_cannot_name_ipv4_internals_written_as_ipv6(cidr: str) -> None:
    refused = (InvalidRequest, ValueError)  # the model refuses a range too broad as IPv4
    with pytest.raises(refused):
        policy = NetworkPolicy.model_validate({"rules": [{"cidr": cidr}]})
        check_tenant_policy(policy, Config())
    with pytest.raises(refused):
        policy = NetworkPolicy.model_validate({"rules": [{"domain": "a.example", "cidr": cidr}]})
        check_tenant_policy(policy, Config())


def test_mapped_ranges_are_stored_as_the_ipv4_they_name() -> None:
    rule = EgressRule.model_validate({"cidr": "::ffff:127.0.0.1/128"})
    assert rule.cidr == "127.0.0.1/32"
    assert EgressRule.model_validate({"cidr": "::ffff:10.20.0.0/112"}).cidr == "10.20.0.0/16"
    with pytest.raises(ValueError, match="too broad"):
        EgressRule.model_validate({"cidr": "::ffff:0.0.0.0/96"})
    # The operator's leave for an IPv4 network covers it written either way, and only it.
    mirror = Config(network_internal_cidrs=["10.20.0.0/16"])
    check_tenant_policy(
        NetworkPolicy.model_validate({"rules": [{"cidr": "::ffff:10.20.1.0/120"}]}), mirror
    )


def _stored(cidr: str, port: int) -> NetworkPolicy:
    """A policy as it was accepted before the fix (validation today refuses it): the proxy
    must not rely on validation alone."""
    rule = EgressRule.model_construct(cidr=cidr, ports=[port])
    return NetworkPolicy.model_construct(mode=NetworkMode.RULES, rules=[rule])


async def test_the_proxy_never_reaches_the_host_loopback_through_an_ipv6_literal(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    port = http_origin.port
    literals = ("::ffff:127.0.0.1", "::ffff:7f00:1", "64:ff9b::7f00:1", "2002:7f00:1::1",
                "::127.0.0.1")  # fmt: skip
    for cidr in ("::ffff:0.0.0.0/96", "::/32", "64:ff9b::/96", "2002::/16"):
        heads = [f"GET http://[{a}]:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n" for a in literals]
        answers = reported(await run(egress_executor, _stored(cidr, port), raw_requests(*heads),
                                     audit))  # fmt: skip
        for literal, answer in zip(literals, answers, strict=True):
            assert "hello from origin" not in answer, (cidr, literal, answer)
            assert status(answer).startswith("HTTP/1.1 403"), (cidr, literal, answer)
    assert http_origin.connections == 0, "the host's loopback-only service was reached"
    records = await audited(audit, "network.connect")
    assert records and all(r.outcome == "denied" for r in records)


# -- H1: bare CR or LF splitting a request ------------------------------------------------------

SECRET = "rf-smuggled-secret-" + "c0de" * 4

# Each hides a second request, which would get the rule's header, behind a bare LF or CR.
SMUGGLING_HEADS = (
    "GET http://secret.test:PORT/ HTTP/1.1\r\nX-A: 1\n\nGET /second HTTP/1.1\nHost: h\r\n\r\n",
    "GET http://secret.test:PORT/ HTTP/1.1\r\nX-A: 1\r\rGET /second HTTP/1.1\r\n\r\n",
    "GET http://secret.test:PORT/a\n\nGET/second HTTP/1.1\r\nHost: h\r\n\r\n",
    "GET http://secret.test:PORT/ HTTP/1.1\nX-A: 1\r\nHost: h\r\n\r\n",
    "GET http://secret.test:PORT/ HTTP/1.1\r\nX-A: 1\x00\x0bz\r\n\r\n",
)


async def test_a_bare_lf_or_cr_cannot_smuggle_a_second_request(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    port = http_origin.port
    policy = rules(
        {"domain": "secret.test", "cidr": "127.0.0.1/32", "ports": [port],
         "headers": {"Authorization": f"Bearer {SECRET}"}},
    )  # fmt: skip
    heads = [head.replace("PORT", str(port)) for head in SMUGGLING_HEADS]
    answers = reported(await run(egress_executor, policy, raw_requests(*heads), audit))
    for head, answer in zip(heads, answers, strict=True):
        assert status(answer).startswith("HTTP/1.1 400"), (head, answer)
        assert SECRET not in answer
    assert http_origin.connections == 0, http_origin.heads
    records = await audited(audit, "network.connect")
    assert [r.outcome for r in records] == ["denied"] * len(heads)


_IN_TUNNEL = """
import json, socket, ssl, sys
out = []
for head in json.loads(sys.argv[1]):
    raw = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    raw.sendall(b"CONNECT secret.test:%s HTTP/1.1\\r\\n\\r\\n" % sys.argv[2].encode())
    assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    tls = ssl.create_default_context().wrap_socket(raw, server_hostname="secret.test")
    tls.sendall(head.encode("latin-1"))
    data = b""
    try:
        while chunk := tls.recv(65536):
            data += chunk
    except (ssl.SSLError, OSError):
        pass
    out.append(data.decode("latin-1"))
report(out)
"""


async def test_a_bare_lf_cannot_smuggle_a_request_inside_an_intercepted_tunnel(
    intercepting_executor: object, tls_origin: Origin, audit: AuditLog
) -> None:
    import json

    port = tls_origin.port
    policy = rules(
        {"domain": "secret.test", "cidr": "127.0.0.1/32", "ports": [port],
         "headers": {"Authorization": f"Bearer {SECRET}"}},
    )  # fmt: skip
    heads = [
        "GET / HTTP/1.1\r\nX-A: 1\n\nGET /second HTTP/1.1\nHost: h\r\n\r\n",
        "GET /a\n\nGET /second HTTP/1.1\r\nHost: h\r\n\r\n",
    ]
    command = python(_IN_TUNNEL, json.dumps(heads), str(port))
    answers = reported(await run(intercepting_executor, policy, command, audit))
    for head, answer in zip(heads, answers, strict=True):
        assert status(answer).startswith("HTTP/1.1 400"), (head, answer)
    assert tls_origin.heads == [], "nothing of a smuggling head reaches the origin"


# -- L1: a port in Unicode digits, and any error inside the proxy -------------------------------


async def test_a_port_in_unicode_digits_is_a_bad_request(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    policy = rules({"domain": "allowed.test", "cidr": "127.0.0.1/32", "ports": [80, 443]})
    heads = ["CONNECT allowed.test:4\xb2 HTTP/1.1\r\n\r\n",
             "GET http://allowed.test:8\xb9/ HTTP/1.1\r\n\r\n"]  # fmt: skip
    answers = reported(await run(egress_executor, policy, raw_requests(*heads), audit))
    for head, answer in zip(heads, answers, strict=True):
        assert status(answer).startswith("HTTP/1.1 400") and "bad port" in answer, (head, answer)
    records = await audited(audit, "network.connect")
    assert [r.outcome for r in records] == ["denied", "denied"]


class _BrokenResolver(Resolver):
    async def resolve(self, host: str, owner: object | None = None) -> list[Address]:
        raise RuntimeError("a bug in the resolver")


async def test_an_unexpected_error_is_audited_as_failed_and_closes_the_connection(
    audit: AuditLog,
) -> None:
    import asyncio

    session = EgressSession(
        Requester("acme", "execution:test", "key-1", audit),
        rules({"domain": "allowed.test", "ports": [80]}),
    )
    escaped: list[BaseException] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve_client(session, _BrokenResolver(), reader, writer, own=OwnEndpoints())
        except BaseException as exc:  # what would be an unhandled task exception
            escaped.append(exc)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET http://allowed.test/ HTTP/1.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)  # the connection is closed
        writer.close()
    assert escaped == []
    assert answer == b"" or answer.startswith(b"HTTP/1.1 502"), answer
    (record,) = await audited(audit, "network.connect")
    assert record.outcome == "failed" and record.details["host"] == "allowed.test"


# -- M1: slow lookups from one sandbox holding every resolver thread ----------------------------


async def test_one_sandboxs_slow_lookups_do_not_starve_another_sandboxs(
    monkeypatch: pytest.MonkeyPatch, audit: AuditLog
) -> None:
    """The host's resolver is replaced by one that never answers names under slow.test
    (until the test ends) and answers fast.test at once: a sandbox floods the first."""
    import asyncio
    import socket
    import struct
    import threading

    from ringfence.network import EgressGateway, dns
    from tests.network.test_wire import query

    release, lock = threading.Event(), threading.Lock()
    in_flight = {"now": 0, "peak": 0}
    host_lookup = socket.getaddrinfo

    def lookup(host: object, *args: object, **kwargs: object) -> object:
        if str(host).endswith(".slow.test"):
            with lock:
                in_flight["now"] += 1
                in_flight["peak"] = max(in_flight["peak"], in_flight["now"])
            release.wait(120)
            with lock:
                in_flight["now"] -= 1
            raise socket.gaierror(socket.EAI_NONAME, "no such name")
        if host == "fast.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
        return host_lookup(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    gateway = EgressGateway(Resolver(), own=own_endpoints(LISTENING))
    flooder = EgressSession(
        Requester("evil", "sandbox:flood", "key-1", audit),
        rules({"domain": "*.slow.test", "cidr": "127.0.0.1/32", "ports": [80]}),
    )
    other = EgressSession(
        Requester("acme", "sandbox:other", "key-2", audit),
        rules({"domain": "fast.test", "cidr": "127.0.0.1/32", "ports": [80]}),
    )
    flood = [
        asyncio.ensure_future(gateway.answer(flooder, query(f"n{i}.slow.test"))) for i in range(64)
    ]
    try:
        while in_flight["now"] < 4:  # the flood holds resolver threads
            await asyncio.sleep(0.01)
        reply = await asyncio.wait_for(gateway.answer(other, query("fast.test")), 60)
        assert reply is not None
        answers = struct.unpack("!H", reply[6:8])[0]
        assert answers == 1 and reply.endswith(bytes([127, 0, 0, 1])), "starved"
        # Past its cap, the flooding sandbox's lookups wait and then fail (SERVFAIL).
        refused = await asyncio.wait_for(gateway.answer(flooder, query("late.slow.test")), 60)
        assert refused is not None
        assert struct.unpack("!H", refused[2:4])[0] & 0xF == dns.SERVFAIL
        assert in_flight["peak"] <= 4, in_flight
    finally:
        release.set()
        await asyncio.gather(*flood, return_exceptions=True)


@pytest.fixture(params=["user", "root"])
async def egress_executor(
    request: pytest.FixtureRequest, local_host: Host, gateway: EgressGateway
) -> AsyncIterator[LocalExecutor]:
    """Each attack as the sandbox user and again as root inside (issue 16): root's raw
    sockets and low ports hold in the sandbox's own empty network namespace only."""
    kind = LocalExecutor if request.param == "user" else RootInside
    executor = kind(Config(), host=local_host, egress=gateway)
    yield executor
    await executor.aclose()
