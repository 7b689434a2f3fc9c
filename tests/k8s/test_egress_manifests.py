"""Egress on Kubernetes, the pure parts: what the builders put in a sandbox Pod with a
network policy, and how the rendered NetworkPolicies treat it. One test per protection;
every object is validated against the official schemas."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from ringfence.backends.kubernetes.egress import (
    EGRESS_GATE_PORT,
    EGRESS_PROXY_PORT,
    GATE_CONTAINER,
    EgressProxy,
)
from ringfence.backends.kubernetes.manifests import job_manifest, pod_manifest
from ringfence.cli import main
from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ExecutionRequest, NetworkPolicy, ResourceLimits

from .conftest import assert_valid

POLICY = NetworkPolicy.model_validate({"rules": [{"domain": "pypi.org", "ports": [443]}]})
PROXY = EgressProxy("10.244.1.7")
URL = f"http://10.244.1.7:{EGRESS_PROXY_PORT}"


def _job(network: NetworkPolicy | None, proxy: EgressProxy | None = PROXY, **env: str) -> Any:
    request = ExecutionRequest(id="x-1", command=["true"], network=network, env=env)
    job = job_manifest(request, Config(backend="job"), proxy)
    assert_valid(job)
    return job["spec"]["template"]


def _pod(network: NetworkPolicy | None, proxy: EgressProxy | None = PROXY, **env: str) -> Any:
    pod = pod_manifest("sb-1", None, env, ResourceLimits(), Config(backend="job"),
                       network=network, egress_proxy=proxy)  # fmt: skip
    assert_valid(pod)
    return pod


def _both(network: NetworkPolicy | None, proxy: EgressProxy | None = PROXY, **env: str) -> Any:
    """The Job's pod template and the sandbox Pod, for the same policy."""
    return [_job(network, proxy, **env), _pod(network, proxy, **env)]


def _env(pod: Any) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def test_rules_without_a_proxy_are_refused_never_ignored() -> None:
    for build in (_job, _pod):
        with pytest.raises(InvalidRequest) as caught:
            build(POLICY, None)
        assert caught.value.code == "invalid_request"
        build(NetworkPolicy(), None)  # no rules: nothing to enforce
        build(None, None)


def test_pods_with_rules_are_labelled_for_the_proxy_only_network_policy() -> None:
    for pod in _both(POLICY):
        assert pod["metadata"]["labels"]["ringfence.dev/egress"] == "proxy"
    for network in (None, NetworkPolicy(), NetworkPolicy(mode="rules", rules=[])):
        for pod in _both(network):
            expected = "proxy" if network is not None and network.mode == "rules" else "none"
            assert pod["metadata"]["labels"]["ringfence.dev/egress"] == expected


def test_the_proxy_variables_name_the_replica_by_address() -> None:
    for pod in _both(POLICY):
        env = _env(pod)
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            assert env[name] == URL
        assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert EgressProxy("fd00::7").url == f"http://[fd00::7]:{EGRESS_PROXY_PORT}"
    with pytest.raises(ValueError):
        EgressProxy("ringfence-control-plane.ringfence-system")  # a name would need DNS
    for pod in _both(None):
        assert not {"HTTP_PROXY", "HTTPS_PROXY"} & set(_env(pod))


def test_the_requests_own_variables_win_as_on_local() -> None:
    for pod in _both(POLICY, NO_PROXY="internal.example"):
        assert _env(pod)["NO_PROXY"] == "internal.example"  # no route there anyway


def test_pods_with_rules_resolve_nothing() -> None:
    for pod in _both(POLICY):
        spec = pod["spec"]
        assert spec["dnsPolicy"] == "None"
        assert spec["dnsConfig"]["nameservers"] == ["127.0.0.1"]
        assert spec["dnsConfig"]["searches"] == []
    for pod in _both(None):
        assert "dnsPolicy" not in pod["spec"] and "dnsConfig" not in pod["spec"]


def test_the_policys_owner_and_proxy_are_annotated() -> None:
    job, pod = _both(POLICY)
    assert job["metadata"]["annotations"]["ringfence.dev/egress-owner"] == "execution:x-1"
    assert pod["metadata"]["annotations"]["ringfence.dev/egress-owner"] == "sandbox:sb-1"
    for each in (job, pod):
        assert each["metadata"]["annotations"]["ringfence.dev/egress-proxy"] == URL


# -- the rendered NetworkPolicies ------------------------------------------------------------


def _render(*args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["k8s", "render", *args], env=env)
    assert result.exit_code == 0, result.output
    objects = [json.loads(d) for d in result.stdout.split("---\n") if d.strip()]
    for manifest in objects:
        assert_valid(manifest)
    return objects


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _policies() -> list[dict[str, Any]]:
    return [o for o in _render() if o["kind"] == "NetworkPolicy"]


def test_every_sandbox_pod_is_selected_by_exactly_one_network_policy() -> None:
    policies = _policies()
    for network, expected in ((POLICY, "ringfence-sandbox-egress-proxy"),
                              (None, "ringfence-sandbox-isolation")):  # fmt: skip
        for pod in _both(network):
            labels = pod["metadata"]["labels"]
            selecting = [
                p["metadata"]["name"]
                for p in policies
                if _selects(p["spec"]["podSelector"], labels)
            ]
            assert selecting == [expected], "policies add up: one more would open a way out"
    unlabelled = {"app.kubernetes.io/managed-by": "ringfence"}  # e.g. made by an older version
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], unlabelled)]
    assert [p["metadata"]["name"] for p in selecting] == ["ringfence-sandbox-isolation"]


def test_pods_with_rules_reach_only_the_control_planes_proxy_port() -> None:
    (policy,) = [
        p for p in _policies() if p["metadata"]["name"] == "ringfence-sandbox-egress-proxy"
    ]
    spec = policy["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    (rule,) = spec["egress"]  # no DNS, no API server, no ipBlock
    assert rule["ports"] == [  # the proxy, and the gate that holds a Job until it admits
        {"protocol": "TCP", "port": EGRESS_PROXY_PORT},
        {"protocol": "TCP", "port": EGRESS_GATE_PORT},
    ]
    assert rule["to"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ringfence-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ringfence-control-plane"}},
    }]  # fmt: skip
    (ingress,) = spec["ingress"]  # the control plane, to the daemon only
    assert ingress["ports"] == [{"protocol": "TCP", "port": Config().kubernetes_daemon_port}]


def test_the_control_plane_serves_the_proxy_on_its_own_pod_address() -> None:
    objects = _render()
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "egress-proxy", "containerPort": EGRESS_PROXY_PORT, "protocol": "TCP"} in (
        container["ports"]
    )
    assert {"name": "egress-gate", "containerPort": EGRESS_GATE_PORT, "protocol": "TCP"} in (
        container["ports"]
    )
    pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
    assert {"name": "RINGFENCE_POD_IP", "valueFrom": pod_ip} in container["env"]
    (service,) = [o for o in objects if o["kind"] == "Service"]
    # Not through the Service: it would spread a sandbox's connections over replicas that
    # do not hold its policy (each would refuse them).
    assert [p["port"] for p in service["spec"]["ports"]] == [80]


def test_nobody_the_sandbox_could_be_can_relabel_a_pod() -> None:
    """The egress label decides which NetworkPolicy holds a Pod: only creating it sets it."""
    objects = _render("--target-namespace", "ringfence-sandboxes")
    for role in (o for o in objects if o["kind"] == "Role"):
        for rule in role["rules"]:
            if "pods" in rule["resources"]:
                assert not {"patch", "update"} & set(rule["verbs"]), role["metadata"]["name"]


def test_moved_ports_move_everywhere_the_replica_and_its_pods_meet() -> None:
    """The replicas listen on the ports of their ConfigMap; the NetworkPolicy opens those."""
    moved = {"RINGFENCE_KUBERNETES_EGRESS_PROXY_PORT": "4128",
             "RINGFENCE_KUBERNETES_EGRESS_GATE_PORT": "4129"}  # fmt: skip
    objects = _render(env=moved)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert moved.items() <= config_map["data"].items()
    (policy,) = [o for o in objects if o["metadata"]["name"] == "ringfence-sandbox-egress-proxy"]
    assert [p["port"] for p in policy["spec"]["egress"][0]["ports"]] == [4128, 4129]


def test_a_jobs_command_waits_behind_the_gate_until_the_proxy_admits_its_pod() -> None:
    """A Job's command starts with its container: an init container (Ringfence's image,
    hardened like the rest) holds it until this replica's proxy has admitted the Pod's
    address for this execution, for a bounded time."""
    (container,) = _job(POLICY)["spec"]["initContainers"]
    assert container["name"] == GATE_CONTAINER
    assert container["image"] == Config().kubernetes_daemon_image
    command = container["command"]
    assert command[-4:] == ["10.244.1.7", str(EGRESS_GATE_PORT), "execution:x-1", "60"]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert "initContainers" not in _job(None)["spec"]  # no rules: nothing to wait for
    assert "initContainers" not in _job(NetworkPolicy())["spec"]
    # A sandbox Pod runs nothing of its own before the replica admits it: no gate.
    assert [c["name"] for c in _pod(POLICY)["spec"]["initContainers"]] == ["daemon"]
