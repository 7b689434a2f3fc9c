"""Attacks on the egress policy from inside real sandboxes. The policy in every test allows
one name on one port; each attack tries to reach anything else. Direct attempts must fail
in the kernel (the namespace has no route), attempts through the proxy must be refused and
audited. Targets outside this machine are documentation addresses (RFC 5737, RFC 3849),
which no packet ever reaches: there is no route for one to leave by."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.probe import Host
from ringfence.config import Config
from ringfence.network.gateway import EgressGateway
from ringfence.service.audit import AuditLog
from tests.integration._attack_helpers import RootInside, python, reported
from tests.network.conftest import Origin, audited
from tests.network.test_egress import LOOPBACK, rules, run

_DIRECT = """
import errno, socket, struct
out = {}
def attempt(key, family, kind, address, proto=0):
    try:
        s = socket.socket(family, kind, proto)
    except OSError as e:
        out[key] = "socket:" + errno.errorcode.get(e.errno, str(e)); return
    s.settimeout(5)
    try:
        if kind == socket.SOCK_DGRAM:
            s.sendto(b"x", address)
            out[key] = "sent"
        else:
            s.connect(address)
            out[key] = "connected"
    except OSError as e:
        out[key] = errno.errorcode.get(e.errno, repr(e))
    finally:
        s.close()
attempt("tcp_ip", socket.AF_INET, socket.SOCK_STREAM, ("192.0.2.1", 443))
attempt("tcp_ip_80", socket.AF_INET, socket.SOCK_STREAM, ("198.51.100.7", 80))
attempt("host_loopback_service", socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", PORT))
attempt("udp", socket.AF_INET, socket.SOCK_DGRAM, ("192.0.2.1", 9999))
attempt("dns_outside", socket.AF_INET, socket.SOCK_DGRAM, ("192.0.2.53", 53))
attempt("dns_outside_tcp", socket.AF_INET, socket.SOCK_STREAM, ("192.0.2.53", 53))
attempt("ipv6", socket.AF_INET6, socket.SOCK_STREAM, ("2001:db8::1", 443))
attempt("ipv6_udp", socket.AF_INET6, socket.SOCK_DGRAM, ("2001:db8::53", 53))
attempt("ipv6_mapped", socket.AF_INET6, socket.SOCK_STREAM, ("::ffff:192.0.2.1", 443))
attempt("raw_icmp", socket.AF_INET, socket.SOCK_RAW, ("192.0.2.1", 0), socket.IPPROTO_ICMP)
attempt("raw_ipv6", socket.AF_INET6, socket.SOCK_RAW, ("2001:db8::1", 0), socket.IPPROTO_ICMPV6)
attempt("packet", socket.AF_PACKET, socket.SOCK_RAW, ("lo", 0))
try:
    out["bind_proxy_port"] = socket.create_server(("127.0.0.1", 3128)) and "bound"
except OSError as e:
    out["bind_proxy_port"] = errno.errorcode.get(e.errno, repr(e))
out["interfaces"] = [name for _, name in socket.if_nameindex()]
out["routes"] = open("/proc/net/route").read().splitlines()[1:]
out["routes6"] = [l for l in open("/proc/net/ipv6_route").read().splitlines() if "lo" not in l]
for name in ("allowed.test", "denied.test", "evil.test"):
    try:
        out["resolve:" + name] = sorted({a[4][0] for a in socket.getaddrinfo(name, 80)})
    except socket.gaierror as e:
        out["resolve:" + name] = "gaierror"
try:
    out["resolve6:allowed.test"] = socket.getaddrinfo("allowed.test", 80, socket.AF_INET6)
except socket.gaierror:
    out["resolve6:allowed.test"] = "gaierror"
report(out)
"""


async def test_nothing_leaves_but_through_the_proxy(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [http_origin.port]})
    script = _DIRECT.replace("PORT", str(http_origin.port))
    out = reported(await run(egress_executor, policy, python(script), audit))
    for key in ("tcp_ip", "tcp_ip_80", "udp", "dns_outside", "dns_outside_tcp", "ipv6",
                "ipv6_udp", "ipv6_mapped"):  # fmt: skip
        assert out[key] == "ENETUNREACH", (key, out[key])
    # The host's own loopback services are not the sandbox's: its 127.0.0.1 is its own.
    assert out["host_loopback_service"] == "ECONNREFUSED"
    assert http_origin.connections == 0
    # The user has no CAP_NET_RAW; root inside has it, in its own empty namespace: the
    # socket opens and nothing has a route out.
    raw = "ENETUNREACH" if isinstance(egress_executor, RootInside) else "socket:EPERM"
    for key in ("raw_icmp", "raw_ipv6"):
        assert out[key] == raw, (key, out[key])
    assert out["packet"] == "socket:EAFNOSUPPORT", "AF_PACKET is not an allowed family"
    assert out["bind_proxy_port"] == "EADDRINUSE", "the proxy holds its port before code runs"
    assert out["interfaces"] == ["lo"]
    assert out["routes"] == [] and out["routes6"] == []
    assert out["resolve:allowed.test"] == ["127.0.0.1"], "control: Ringfence's resolver answers"
    assert out["resolve:denied.test"] == "gaierror"
    assert out["resolve:evil.test"] == "gaierror"
    assert out["resolve6:allowed.test"] == "gaierror", "no IPv6 answers: IPv6 has no way out"
    dns = {(r.details["name"], r.outcome) for r in await audited(audit, "network.dns")}
    assert ("denied.test", "denied") in dns and ("allowed.test", "allowed") in dns
    # The kernel refused the direct attempts; their number is on the record all the same.
    (blocked,) = await audited(audit, "network.blocked")
    assert (blocked.target, blocked.outcome) == ("execution:test", "denied")
    assert blocked.details["ipv4_no_route"] >= 6, blocked.details  # TCP, UDP, DNS, v4-mapped
    assert blocked.details["ipv6_no_route"] >= 2, blocked.details


_THROUGH_PROXY = """
import socket
def ask(head, expect_tunnel=False):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(head.encode() + b"\\r\\n\\r\\n")
    answer = s.recv(65536).split(b"\\r\\n")[0].decode()
    s.close()
    return answer
out = {}
out["other_port"] = ask("CONNECT allowed.test:22 HTTP/1.1")
out["ip_literal"] = ask("CONNECT 127.0.0.1:PORT HTTP/1.1")
out["ip_literal_http"] = ask("GET http://127.0.0.1:PORT/ HTTP/1.1")
out["ipv6_literal"] = ask("CONNECT [::1]:PORT HTTP/1.1")
out["https_in_plain"] = ask("GET https://allowed.test:PORT/ HTTP/1.1")
out["origin_form"] = ask("GET / HTTP/1.1\\r\\nHost: allowed.test:PORT")
out["smuggled_host"] = ask("GET http://allowed.test:PORT/ HTTP/1.1\\r\\nHost: evil.test")
out["userinfo"] = ask("GET http://evil.test@allowed.test:PORT/ HTTP/1.1")
out["denied_name"] = ask("CONNECT evil.test:PORT HTTP/1.1")
out["garbage"] = ask("\\x16\\x03\\x01 not http")
report(out)
"""


async def test_the_proxy_refuses_everything_the_policy_does_not_allow(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [http_origin.port]})
    script = _THROUGH_PROXY.replace("PORT", str(http_origin.port))
    out = reported(await run(egress_executor, policy, python(script), audit))
    for key in ("other_port", "ip_literal", "ip_literal_http", "ipv6_literal", "denied_name"):
        assert out[key].startswith("HTTP/1.1 403 egress denied by Ringfence"), (key, out[key])
    for key in ("https_in_plain", "origin_form", "userinfo", "garbage"):
        assert out[key].startswith("HTTP/1.1 400 egress refused"), (key, out[key])
    assert out["smuggled_host"] == "HTTP/1.1 200 OK"
    heads = [head.decode() for head in http_origin.heads]
    assert len(heads) == 1 and "Host: allowed.test" in heads[0] and "evil" not in heads[0]
    outcomes = [r.outcome for r in await audited(audit, "network.connect")]
    assert outcomes.count("denied") == 9 and outcomes.count("allowed") == 1, outcomes


_SNI = """
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"CONNECT allowed.test:PORT HTTP/1.1\\r\\n\\r\\n")
status = s.recv(4096).split(b"\\r\\n")[0].decode()
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
try:
    tls = context.wrap_socket(s, server_hostname="evil.test")
    outcome = "handshake completed"
except (OSError, ssl.SSLError) as e:
    outcome = getattr(e, "reason", None) or type(e).__name__
report({"status": status, "outcome": outcome})
"""


async def test_a_tls_server_name_other_than_the_connect_host_is_cut_off(
    egress_executor: object, raw_origin: Origin, audit: AuditLog
) -> None:
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [raw_origin.port]})
    script = _SNI.replace("PORT", str(raw_origin.port))
    out = reported(await run(egress_executor, policy, python(script), audit))
    assert out["status"] == "HTTP/1.1 200 Connection established"
    assert out["outcome"] == "TLSV1_ALERT_ACCESS_DENIED", "the client is told, in TLS"
    assert raw_origin.received == 0, "not one byte of the hello reached the origin"
    (record,) = await audited(audit, "network.connect")
    assert record.outcome == "denied" and record.details["sni"] == "evil.test"
    assert "is not the CONNECT host" in record.details["reason"]


async def test_no_policy_means_no_proxy_and_no_resolver(
    egress_executor: object, http_origin: Origin
) -> None:
    script = """
    import errno, socket
    out = {}
    for port in (3128, 53):
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", port)); out[port] = "connected"
        except OSError as e:
            out[port] = errno.errorcode[e.errno]
    try:
        socket.getaddrinfo("allowed.test", 80); out["dns"] = "answered"
    except socket.gaierror:
        out["dns"] = "gaierror"
    import os
    out["proxy_env"] = sorted(k for k in os.environ if "proxy" in k.lower())
    report(out)
    """
    out = reported(await run(egress_executor, None, python(script)))
    assert out == {"3128": "ECONNREFUSED", "53": "ECONNREFUSED", "dns": "gaierror",
                   "proxy_env": []}  # fmt: skip


async def test_a_flood_of_proxy_connections_is_cut_at_the_in_flight_limit(
    egress_executor: object, http_origin: Origin
) -> None:
    from ringfence.network.gateway import MAX_IN_FLIGHT

    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [http_origin.port]})
    script = f"""
    import socket, urllib.request
    held = [socket.create_connection(("127.0.0.1", 3128)) for _ in range({MAX_IN_FLIGHT + 40})]
    extra = held[-40:]
    for s in extra:
        s.settimeout(20)
    closed = sum(1 for s in extra if s.recv(1) == b"")
    for s in held:
        s.close()
    import time
    deadline = time.monotonic() + 20  # the held ones end as the server sees them close
    while True:
        try:
            url = "http://allowed.test:{http_origin.port}/"
            body = urllib.request.urlopen(url, timeout=20).read().decode()
            break
        except OSError as e:
            body = str(e)
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    report({{"closed": closed, "after": body}})
    """
    out = reported(await run(egress_executor, policy, python(script)))
    assert out == {"closed": 40, "after": "hello from origin\n"}


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
