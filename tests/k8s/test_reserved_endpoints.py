"""Ringfence's own endpoints on Kubernetes (security review of issue 14): a sandbox Pod's
policy whose CIDR covers the cluster's ranges still never reaches another replica's API,
proxy or gate, nor the API's Service."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from ringfence.backends.kubernetes.replica_egress import replica_own_endpoints
from ringfence.config import Config

from .test_render import _one, _render


def _proc(tmp_path: Path) -> Path:
    """A Pod's /proc/net: its loopback and its Pod IP, 10.1.0.5."""
    net = tmp_path / "net"
    net.mkdir()
    (net / "fib_trie").write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n"
        "     +-- 127.0.0.0/8 2 0 2\n           |-- 127.0.0.0\n              /8 host LOCAL\n"
        "           |-- 10.1.0.5\n              /32 host LOCAL\n"
    )
    return tmp_path


async def test_a_replica_refuses_ringfences_ports_on_every_internal_address(
    tmp_path: Path,
) -> None:
    config = Config(
        pod_ip="10.1.0.5",
        network_reserved_endpoints=["0.0.0.0:8080"],  # what serve adds: its API
        kubernetes_reserved_services=["10.96.7.7:80"],
    )
    listening = [(ipaddress.ip_address("10.1.0.5"), 3128), (ipaddress.ip_address("10.1.0.5"), 3129)]
    own = await replica_own_endpoints(config, listening, _proc(tmp_path))
    for other_replica in ("10.1.3.9", "172.16.0.4", "fd00::9"):
        for port in (8080, 3128, 3129):
            assert own.holds(ipaddress.ip_address(other_replica), port), (other_replica, port)
    assert own.holds(ipaddress.ip_address("10.96.7.7"), 80), "the API's Service"
    assert not own.holds(ipaddress.ip_address("10.96.7.8"), 80), "another Service's port 80"
    assert not own.holds(ipaddress.ip_address("10.1.3.9"), 5432), "other ports stay ruled"
    assert not own.holds(ipaddress.ip_address("93.184.215.14"), 8080), "public: not ours"


async def test_a_reserved_service_that_does_not_resolve_fails_the_start(tmp_path: Path) -> None:
    config = Config(pod_ip="10.1.0.5", kubernetes_reserved_services=["no-such.invalid:80"])
    with pytest.raises(OSError, match=r"no-such\.invalid"):
        await replica_own_endpoints(config, [], _proc(tmp_path))


@pytest.mark.parametrize("bad", ["ringfence", "ringfence:0", ":80", "ringfence:x"])
def test_a_reserved_service_that_is_not_name_and_port_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="NAME:PORT"):
        Config(kubernetes_reserved_services=[bad])


def test_the_rendered_replicas_reserve_the_apis_service() -> None:
    objects = _render()
    service = _one(objects, "Service")
    (port,) = service["spec"]["ports"]
    config_map = _one(objects, "ConfigMap")
    reserved = json.loads(config_map["data"]["RINGFENCE_KUBERNETES_RESERVED_SERVICES"])
    name = service["metadata"]["name"]
    assert reserved == [f"{name}.{service['metadata']['namespace']}.svc:{port['port']}"]
    assert Config(kubernetes_reserved_services=reserved).kubernetes_reserved_services == reserved
    kinds = [o["kind"] for o in objects]
    assert kinds.index("Service") < kinds.index("Deployment"), "its name resolves at start"
