"""``ringfence k8s render``: every object is valid, and the guards are what they claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ringfence.audit.signing import KEY_FILE, SealKey
from ringfence.backends.kubernetes.manifests import job_manifest
from ringfence.cli import main
from ringfence.config import Config
from ringfence.models import ExecutionRequest

from .conftest import assert_valid


def _render(*args: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["k8s", "render", *args])
    assert result.exit_code == 0, result.output
    documents = [d for d in result.stdout.split("---\n") if d.strip()]
    objects = [json.loads(d) for d in documents]
    for manifest in objects:
        assert_valid(manifest)
    return objects


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind
                and (name is None or o["metadata"]["name"] == name)]  # fmt: skip
    return found


def test_render_prints_every_object_valid() -> None:
    kinds = [o["kind"] for o in _render("--runtime-class", "gvisor")]
    for kind in ("Namespace", "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy",
                 "RuntimeClass", "ResourceQuota", "LimitRange", "Deployment", "Service",
                 "ConfigMap", "Secret"):  # fmt: skip
        assert kind in kinds
    assert "RuntimeClass" not in [o["kind"] for o in _render()]


def test_runtime_class_gvisor_uses_runsc_and_the_control_plane_asks_for_it() -> None:
    objects = _render("--runtime-class", "gvisor")
    assert _one(objects, "RuntimeClass")["handler"] == "runsc"
    settings = _one(objects, "ConfigMap")["data"]
    assert settings["RINGFENCE_RUNTIME_CLASS_NAME"] == "gvisor"
    assert settings["SANDBOX_BACKEND"] == "job"


def test_network_policy_allows_only_dns_and_the_api_server() -> None:
    objects = _render("--api-server-cidr", "172.18.0.2/32")
    policy = _one(objects, "NetworkPolicy", "ringfence-sandbox-isolation")["spec"]
    # Every sandbox Pod but those whose only way out is the egress proxy (test_egress_manifests)
    assert policy["podSelector"] == {
        "matchExpressions": [{"key": "ringfence.dev/egress", "operator": "NotIn",
                              "values": ["proxy"]}]
    }  # fmt: skip
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    dns, api = policy["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert api["to"] == [{"ipBlock": {"cidr": "172.18.0.2/32"}}]
    assert {p["port"] for p in api["ports"]} == {443, 6443}
    (ingress,) = policy["ingress"]  # only the control plane, only to the daemon
    assert ingress["ports"] == [{"protocol": "TCP", "port": Config().kubernetes_daemon_port}]
    assert ingress["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "ringfence-control-plane"
    }


def _rules(objects: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    role = next(o for o in objects if o["kind"] == "Role"
                and o["metadata"]["namespace"] == namespace)  # fmt: skip
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def test_roles_are_least_privilege() -> None:
    objects = _render("--target-namespace", "payments")
    control = _rules(objects, "ringfence-sandboxes")
    remediation = _rules(objects, "payments")
    for rules in (control, remediation):
        for rule in rules:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert "secrets" not in rule["resources"]
    assert {r for rule in control for r in rule["resources"]} == {"jobs", "pods", "pods/log"}
    assert {v for rule in remediation for v in rule["verbs"]} <= {"get", "list", "delete", "patch"}
    assert not any(o["kind"] in ("ClusterRole", "ClusterRoleBinding") for o in objects)
    binding = next(o for o in objects if o["kind"] == "RoleBinding"
                   and o["metadata"]["namespace"] == "payments")  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ringfence-sandbox", "namespace": "ringfence-sandboxes"}
    ]


def test_sandbox_namespace_enforces_restricted_pod_security_and_quota() -> None:
    objects = _render()
    namespace = _one(objects, "Namespace", "ringfence-sandboxes")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    account = _one(objects, "ServiceAccount", "ringfence-sandbox")
    assert account["automountServiceAccountToken"] is False
    hard = _one(objects, "ResourceQuota")["spec"]["hard"]
    assert {"pods", "limits.memory", "limits.cpu"} <= set(hard)
    (limits,) = _one(objects, "LimitRange")["spec"]["limits"]
    assert {"default", "max"} <= set(limits)


def test_control_plane_runs_two_hardened_replicas_on_postgres() -> None:
    objects = _render("--database-url", "postgresql+psycopg://rf:pw@db:5432/rf")
    deployment = _one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    secret = _one(objects, "Secret", "ringfence-control-plane")
    assert secret["stringData"]["RINGFENCE_DATABASE_URL"].startswith("postgresql+psycopg://")
    service = _one(objects, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_rendered_namespace_and_account_match_the_jobs() -> None:
    objects = _render()
    job = job_manifest(ExecutionRequest(command=["true"]), Config(backend="job"))
    assert job["metadata"]["namespace"] == _one(objects, "Namespace", "ringfence-sandboxes")[
        "metadata"]["name"]  # fmt: skip
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    assert _one(objects, "ServiceAccount", account)


@pytest.mark.parametrize("bad", ["nope", "10.0.0.0/33"])
def test_a_bad_api_server_address_is_a_usage_error(bad: str) -> None:
    result = CliRunner().invoke(main, ["k8s", "render", "--api-server-cidr", bad])
    assert result.exit_code == 2
    assert "--api-server-cidr" in result.output and "Traceback" not in result.output


def test_every_replica_seals_the_audit_log_with_one_key(tmp_path: Path) -> None:
    SealKey.load_or_create(tmp_path)
    objects = _render("--seal-key-file", str(tmp_path / KEY_FILE))
    secret = _one(objects, "Secret", "ringfence-audit-seal-key")
    assert secret["stringData"][KEY_FILE] == (tmp_path / KEY_FILE).read_text()
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "seal-key"]
    assert mount == {"name": "seal-key", "mountPath": f"/var/lib/ringfence/{KEY_FILE}",
                     "subPath": KEY_FILE, "readOnly": True}  # fmt: skip
    # The file the server loads is the one the Secret holds.
    (tmp_path / "replica").mkdir()
    (tmp_path / "replica" / KEY_FILE).write_text(secret["stringData"][KEY_FILE])
    assert SealKey.load_or_create(tmp_path / "replica").public_key == (
        SealKey.load_or_create(tmp_path).public_key
    )


def test_without_a_key_file_a_new_key_is_rendered_and_said_so() -> None:
    result = CliRunner().invoke(main, ["k8s", "render"])
    assert result.exit_code == 0 and "--seal-key-file" in result.stderr


def test_a_file_without_a_key_is_refused(tmp_path: Path) -> None:
    (tmp_path / "nokey").write_text("not base64 !")
    result = CliRunner().invoke(main, ["k8s", "render", "--seal-key-file", str(tmp_path / "nokey")])
    assert result.exit_code == 2 and "holds no seal key" in result.output


def test_every_replica_opens_proposals_credentials_with_one_key(tmp_path: Path) -> None:
    from ringfence.models import NetworkPolicy
    from ringfence.service.credentials import KEY_FILE as CREDENTIALS_KEY_FILE
    from ringfence.service.credentials import CredentialKey

    key = CredentialKey.load_or_create(tmp_path)
    objects = _render("--credentials-key-file", str(tmp_path / CREDENTIALS_KEY_FILE))
    secret = _one(objects, "Secret", "ringfence-credentials-key")
    text = secret["stringData"][CREDENTIALS_KEY_FILE]
    assert text == (tmp_path / CREDENTIALS_KEY_FILE).read_text()
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    mounts = pod["containers"][0]["volumeMounts"]
    (mount,) = [m for m in mounts if m["name"] == "credentials-key"]
    assert mount == {"name": "credentials-key",
                     "mountPath": f"/var/lib/ringfence/{CREDENTIALS_KEY_FILE}",
                     "subPath": CREDENTIALS_KEY_FILE, "readOnly": True}  # fmt: skip
    (volume,) = [v for v in pod["volumes"] if v["name"] == "credentials-key"]
    assert volume["secret"] == {"secretName": "ringfence-credentials-key", "defaultMode": 0o440}
    # What one replica seals, another (loading the Secret's file) opens.
    replica = tmp_path / "replica"
    replica.mkdir()
    (replica / CREDENTIALS_KEY_FILE).write_text(text)
    (replica / CREDENTIALS_KEY_FILE).chmod(0o440)
    policy = NetworkPolicy.model_validate(
        {"rules": [{"domain": "api.vendor.example", "headers": {"X-Api-Key": "v"}}]}
    )
    sealed = key.seal(policy, tenant="acme", proposal_id="cp1")
    other = CredentialKey.load_or_create(replica)
    marked = key.marked(policy, tenant="acme", proposal_id="cp1")
    assert other.open(sealed, marked, tenant="acme", proposal_id="cp1") == policy


def test_without_a_credentials_key_file_a_new_key_is_rendered_and_said_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["k8s", "render"])
    assert result.exit_code == 0 and "--credentials-key-file" in result.stderr
    (tmp_path / "nokey").write_text("not base64 !")
    refused = CliRunner().invoke(
        main, ["k8s", "render", "--credentials-key-file", str(tmp_path / "nokey")]
    )
    assert refused.exit_code == 2 and "holds no credentials key" in refused.output
