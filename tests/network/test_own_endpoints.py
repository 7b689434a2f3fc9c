"""Ringfence never reaches itself through its egress proxy, whatever the rules: a sandbox
allowed loopback (or the host's own addresses) would otherwise reach the API with its
creator's key and widen its own policy. And plain HTTP inside a CONNECT tunnel is held to
the Host rule of proxied HTTP."""

from __future__ import annotations

import http.server
import ipaddress
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringfence.config import Config
from ringfence.models import EgressAction, NetworkPolicy
from ringfence.network.http import starts_request
from ringfence.network.own import host_networks, own_endpoints_of
from ringfence.policy.egress import Address, OwnEndpoints, check_addresses, decide, own_endpoints
from ringfence.service.audit import AuditLog
from tests.integration._attack_helpers import python, reported
from tests.network.conftest import Origin, audited
from tests.network.test_egress import LOOPBACK, rules, run
from tests.server.test_serve_process import Server

API_PORT = 8080
INTERFACE = ipaddress.ip_address("192.0.2.2")  # an address of "this host" in the pure tests


def _own() -> OwnEndpoints:
    """Ringfence's API on 0.0.0.0:8080 of a host whose interface is 192.0.2.2."""
    any_v4 = ipaddress.ip_address("0.0.0.0")
    return own_endpoints([(any_v4, API_PORT)], [ipaddress.ip_network(f"{INTERFACE}/32")])


def _allowing_everything() -> NetworkPolicy:
    cidrs = ["0.0.0.0/8", "127.0.0.0/8", "192.0.2.0/24", "::1/128"]
    ports = [API_PORT, API_PORT + 1]
    return NetworkPolicy.model_validate({"mode": "rules", "rules": [
        *({"cidr": cidr, "ports": ports} for cidr in cidrs),
        {"domain": "api.test", "cidr": "127.0.0.0/8", "ports": ports},
    ]})  # fmt: skip


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "127.3.2.1", "0.0.0.0", "::ffff:127.0.0.1", "::1", str(INTERFACE)],
)
def test_every_address_of_this_host_at_a_ringfence_port_is_refused(address: str) -> None:
    policy = _allowing_everything()
    literal = ipaddress.ip_address(address)
    verdict = decide(policy, address, API_PORT)
    assert verdict.allowed, "control: the rules allow it"
    checked = check_addresses(policy, verdict, address, API_PORT, [literal], own=_own())
    assert checked.action is EgressAction.DENY and "Ringfence's own" in checked.reason
    other_port = decide(policy, address, API_PORT + 1)
    assert check_addresses(policy, other_port, address, API_PORT + 1, [literal], own=_own()).allowed


def test_a_name_resolving_to_ringfence_is_refused_and_other_addresses_stay_usable() -> None:
    policy = _allowing_everything()
    verdict = decide(policy, "api.test", API_PORT)
    loopback = ipaddress.ip_address("127.0.0.1")
    refused = check_addresses(policy, verdict, "api.test", API_PORT, [loopback], own=_own())
    assert refused.action is EgressAction.DENY
    mixed: list[Address] = [loopback, ipaddress.ip_address("127.0.0.9")]
    assert not check_addresses(policy, verdict, "api.test", API_PORT, mixed, own=_own()).allowed


def test_an_endpoint_elsewhere_is_refused_exactly() -> None:
    replica = ipaddress.ip_address("10.0.0.7")
    own = own_endpoints([(replica, 9000)])
    assert own.holds(replica, 9000) and own.holds(ipaddress.ip_address("::ffff:10.0.0.7"), 9000)
    assert not own.holds(replica, 9001) and not own.holds(ipaddress.ip_address("10.0.0.8"), 9000)
    assert not own.holds(ipaddress.ip_address("127.0.0.1"), 9000), "not a port of this host"


def test_this_host_s_addresses_come_from_its_local_routes(tmp_path: Path) -> None:
    net = tmp_path / "net"
    net.mkdir()
    (net / "fib_trie").write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
        "     +-- 127.0.0.0/8 2 0 2\n           |-- 127.0.0.0\n              /8 host LOCAL\n"
        "           |-- 10.1.2.3\n              /32 host LOCAL\n"
        "           |-- 10.1.2.255\n              /32 link BROADCAST\n"
        "           |-- 172.20.0.0\n              /16 host LOCAL\n"  # ip route add local
    )
    (net / "if_inet6").write_text(
        "fd000000000000000000000000000002 02 40 00 80     eth0\n"
        "00000000000000000000000000000001 01 80 10 80       lo\n"
    )
    assert host_networks(tmp_path) == [
        ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("10.1.2.3/32"),
        ipaddress.ip_network("172.20.0.0/16"), ipaddress.ip_network("fd00::2/128"),
        ipaddress.ip_network("::1/128"),
    ]  # fmt: skip
    config = Config(network_reserved_endpoints=["[::]:8080", "10.9.9.9:7000"])
    own = own_endpoints_of(config, proc=tmp_path)
    assert own.holds(ipaddress.ip_address("172.20.5.5"), 8080)
    assert own.holds(ipaddress.ip_address("10.9.9.9"), 7000)


def test_a_reserved_endpoint_that_is_not_address_and_port_is_refused_at_start() -> None:
    for bad in ("localhost:80", "127.0.0.1", "::1:80", "127.0.0.1:0", "1.2.3.4:x"):
        with pytest.raises(ValueError, match="network_reserved_endpoints"):
            Config(network_reserved_endpoints=[bad])


def test_a_request_line_is_told_from_other_protocols() -> None:
    assert starts_request(b"GET / HTTP/1.1\r\n") is True
    assert starts_request(b"PRI * HTTP/2.0") is True, "h2c prior knowledge is HTTP too"
    assert starts_request(b"GE") is None, "undecided until a space or another byte"
    assert starts_request(b"SSH-2.0-x\r\n") is False
    assert starts_request(b"\x16\x03\x01") is False
    assert starts_request(b" GET") is True, "a lenient origin may parse it: held to the rules"


def test_the_egress_proxies_protect_nothing_by_default_never() -> None:
    import inspect

    from ringfence.backends.kubernetes.egress_proxy import PodEgressProxy
    from ringfence.network.gateway import EgressGateway

    for proxy in (PodEgressProxy, EgressGateway):
        own = inspect.signature(proxy).parameters["own"]
        assert own.default is inspect.Parameter.empty, f"{proxy.__name__}: own is required"


class _ApiServer(Server):
    """``ringfence serve`` on every IPv4 address of this host."""

    def args(self) -> list[str]:
        return ["--host", "0.0.0.0", *super().args()]


@pytest.fixture
def plain_origin() -> Iterator[int]:
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_sandbox_cannot_reach_the_api_through_its_proxy_even_with_loopback_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plain_origin: int
) -> None:
    interface = next(
        (n.network_address for n in host_networks()
         if n.version == 4 and n.prefixlen == 32 and not n.network_address.is_loopback),
        None,
    )  # fmt: skip
    internal = ["127.0.0.0/8", "0.0.0.0/32", *([f"{interface}/32"] if interface else [])]
    monkeypatch.setenv("RINGFENCE_NETWORK_INTERNAL_CIDRS", json.dumps(internal))
    monkeypatch.setenv("RINGFENCE_NETWORK_HOSTS", json.dumps({"api.test": ["127.0.0.1"]}))
    server = _ApiServer(tmp_path / "data", None)
    server.start()
    try:
        api, origin = server.port, plain_origin
        admin = {"Authorization": f"Bearer {(server.data_dir / 'admin-key').read_text().strip()}"}
        targets = [f"127.0.0.1:{api}", f"127.0.0.2:{api}", f"0.0.0.0:{api}",
                   f"[::ffff:127.0.0.1]:{api}", f"api.test:{api}",
                   *([f"{interface}:{api}"] if interface else [])]  # fmt: skip
        network = {"rules": [
            {"cidr": "127.0.0.0/8", "ports": [api, origin]},
            {"cidr": "0.0.0.0/32", "ports": [api]},
            {"domain": "api.test", "cidr": "127.0.0.0/8", "ports": [api]},
            *([{"cidr": f"{interface}/32", "ports": [api]}] if interface else []),
        ]}  # fmt: skip
        script = f"""
        import socket
        def first_line(head):
            s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
            s.sendall(head.encode())
            return s.makefile("rb").readline().decode().strip()
        out = {{}}
        for target in {targets!r}:
            out[target] = first_line(f"GET http://{{target}}/v1/health HTTP/1.1\\r\\n\\r\\n")
        out["connect"] = first_line("CONNECT 127.0.0.1:{api} HTTP/1.1\\r\\n\\r\\n")
        out["origin"] = first_line("GET http://127.0.0.1:{origin}/ HTTP/1.1\\r\\n\\r\\n")
        report(out)
        """
        response = httpx.post(
            f"{server.url}/v1/executions", headers=admin, timeout=60,
            json={"command": python(script), "network": network, "timeout": 60},
        )  # fmt: skip
        assert response.status_code == 200, response.text
        out = json.loads(response.json()["logs"].split("RESULT ", 1)[1])
    finally:
        server.stop()
    assert " 200 " in out.pop("origin"), "control: the rules reach loopback"
    for target, line in out.items():
        assert line.startswith("HTTP/1.1 403 ") and "Ringfence's own" in line, (target, line)


async def test_plain_http_through_a_tunnel_cannot_name_another_host(
    egress_executor: object, http_origin: Origin, audit: AuditLog
) -> None:
    port = http_origin.port
    policy = rules({"domain": "allowed.test", "cidr": LOOPBACK, "ports": [port]})
    script = f"""
    import socket
    def tunnel(request):
        s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        s.sendall(b"CONNECT allowed.test:{port} HTTP/1.1\\r\\n\\r\\n")
        f = s.makefile("rb")
        status = f.readline(); f.readline()
        for part in request:  # split: the proxy must wait for the whole head
            s.sendall(part)
        return [status.decode().strip(), f.readline().decode().strip()]
    report({{
        "other": tunnel([b"G", b"ET / HTTP/1.1\\r\\nHost: evil.test\\r\\n\\r\\n"]),
        "same": tunnel([b"GET /ok HTTP/1.1\\r\\nHost: allowed.test:{port}\\r\\n\\r\\n"]),
        "absolute": tunnel([b"GET http://evil.test/ HTTP/1.1\\r\\n\\r\\n"]),
        "two_hosts": tunnel([b"GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n"
                             b"Host: evil.test\\r\\n\\r\\n"]),
    }})
    """
    out = reported(await run(egress_executor, policy, python(script), audit))
    assert out["other"][0] == "HTTP/1.1 200 Connection established"
    assert out["other"][1].startswith("HTTP/1.1 403 ") and "evil.test" in out["other"][1]
    assert out["absolute"][1].startswith("HTTP/1.1 400 "), out
    assert out["two_hosts"][1].startswith("HTTP/1.1 400 "), out
    assert out["same"][1] == "HTTP/1.1 200 OK", "control: the allowed name's own Host passes"
    assert len(http_origin.heads) == 1, "only the allowed request reached the origin"
    assert http_origin.heads[0].startswith(b"GET /ok HTTP/1.1\r\n")
    assert f"Host: allowed.test:{port}\r\n".encode() in http_origin.heads[0]
    assert b"Connection: close\r\n" in http_origin.heads[0], "one request per tunnel"
    records = await audited(audit, "network.connect")
    assert sorted(r.outcome for r in records) == ["allowed", "denied", "denied", "denied"]
