"""The Job and Pod builders: every object is valid and carries every protection."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions, major_minor

from ringfence.backends.kubernetes.manifests import (
    job_manifest,
    job_name,
    label_value,
    pod_manifest,
)
from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import EgressRule, ExecutionRequest, Mount, NetworkPolicy, ResourceLimits

from .conftest import SCHEMA_VERSION, assert_valid

REQUEST = ExecutionRequest(
    id="Exec_42.",  # capitals and a trailing dot: not a valid label value as it is
    session_id="session-1",
    task_id="task 7 (restart the api)",
    checkpoint_id="cp0123456789abcdef0123",
    approved_by="key-alice,key-bob",
    remediation_action="restart-deployment",
    target_namespace="payments",
    command=["sh", "-c"],
    args=["echo hi"],
    env={"MODE": "dry-run"},
    timeout=90.5,
    limits=ResourceLimits(memory="256M", cpus=0.5, disk="64M"),
)


def _job(config: Config, request: ExecutionRequest = REQUEST) -> dict[str, Any]:
    job = job_manifest(request, config)
    assert_valid(job)
    return job


def _pods(config: Config) -> list[dict[str, Any]]:
    """The pod spec of the Job and of an interactive sandbox's Pod, both validated."""
    pod = pod_manifest("sb0123", None, {"A": "1"}, ResourceLimits(memory="128M", disk="32M"),
                       config)  # fmt: skip
    assert_valid(pod)
    return [_job(config)["spec"]["template"]["spec"], pod["spec"]]


def _containers(config: Config) -> list[dict[str, Any]]:
    return [c for spec in _pods(config) for c in [*spec["containers"],
            *spec.get("initContainers", [])]]  # fmt: skip


def test_schema_version_is_the_newest_shipped() -> None:
    assert major_minor(SCHEMA_VERSION) == max(major_minor(v) for v in all_versions())


def test_the_validator_rejects_what_the_api_server_would(config: Config) -> None:
    job = _job(config)
    job["spec"]["backoffLimit"] = "zero"
    with pytest.raises(kubernetes_validate.ValidationError):
        assert_valid(job)
    job = _job(config)
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privilegd"] = False
    with pytest.raises(kubernetes_validate.ValidationError):
        assert_valid(job)


def test_backoff_limit_is_zero(config: Config) -> None:
    assert _job(config)["spec"]["backoffLimit"] == 0


def test_restart_policy_is_never(config: Config) -> None:
    assert all(spec["restartPolicy"] == "Never" for spec in _pods(config))


def test_active_deadline_comes_from_the_timeout(config: Config) -> None:
    job = _job(config)
    assert job["spec"]["activeDeadlineSeconds"] == 91  # 90.5 rounded up, never down
    untimed = _job(config, REQUEST.model_copy(update={"timeout": None}))
    assert untimed["spec"]["activeDeadlineSeconds"] == int(config.default_timeout)
    pod = pod_manifest("sb1", None, {}, ResourceLimits(), config)
    assert pod["spec"]["activeDeadlineSeconds"] == int(config.max_timeout)  # the backstop


def test_ttl_after_finished_comes_from_config() -> None:
    job = _job(Config(backend="job", ttl_seconds_after_finished=120))
    assert job["spec"]["ttlSecondsAfterFinished"] == 120


def test_service_account_token_is_not_mounted_unless_configured(config: Config) -> None:
    for spec in _pods(config):
        assert spec["serviceAccountName"] == config.service_account
        assert spec["automountServiceAccountToken"] is False
    mounting = Config(backend="job", automount_service_account_token=True)
    assert _job(mounting)["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


def test_pods_run_as_non_root(config: Config) -> None:
    for spec in _pods(config):
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == config.kubernetes_run_as_user > 0
    assert all(c["securityContext"]["runAsNonRoot"] is True for c in _containers(config))


def test_seccomp_is_runtime_default(config: Config) -> None:
    for spec in _pods(config):
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_no_privilege_escalation(config: Config) -> None:
    assert all(c["securityContext"]["allowPrivilegeEscalation"] is False
               for c in _containers(config))  # fmt: skip


def test_not_privileged_and_no_host_namespaces(config: Config) -> None:
    assert all(c["securityContext"]["privileged"] is False for c in _containers(config))
    for spec in _pods(config):
        assert spec["hostNetwork"] is spec["hostPID"] is spec["hostIPC"] is False


def test_every_capability_is_dropped(config: Config) -> None:
    for container in _containers(config):
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_root_filesystem_is_read_only(config: Config) -> None:
    assert all(c["securityContext"]["readOnlyRootFilesystem"] is True
               for c in _containers(config))  # fmt: skip


def test_writable_places_are_size_limited_empty_dirs(config: Config) -> None:
    job_spec, pod_spec = _pods(config)
    for spec, disk in ((job_spec, 64 << 20), (pod_spec, 32 << 20)):
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["workspace"]["emptyDir"] == {"sizeLimit": str(disk)}
        assert volumes["tmp"]["emptyDir"] == {"sizeLimit": str(disk)}
        assert set(volumes) <= {"workspace", "tmp", "daemon"}  # no hostPath, no secret
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert {"/workspace", "/tmp"} <= mounts
    daemon = next(m for m in pod_spec["containers"][0]["volumeMounts"] if m["name"] == "daemon")
    assert daemon["readOnly"] is True  # the sandbox cannot change its own daemon


def test_resources_request_and_limit_the_same(config: Config) -> None:
    container = _job(config)["spec"]["template"]["spec"]["containers"][0]
    expected = {"memory": str(256 << 20), "cpu": "500m", "ephemeral-storage": str(128 << 20)}
    assert container["resources"] == {"requests": expected, "limits": expected}
    defaulted = _job(config, REQUEST.model_copy(update={"limits": ResourceLimits()}))
    limits = defaulted["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"] == str(config.default_limits.memory)


def test_runtime_class_only_when_configured(config: Config) -> None:
    assert all("runtimeClassName" not in spec for spec in _pods(config))
    gvisor = Config(backend="job", runtime_class_name="gvisor")
    assert all(spec["runtimeClassName"] == "gvisor" for spec in _pods(gvisor))


def test_labels_and_annotations_carry_the_ids(config: Config) -> None:
    job = _job(config)
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        annotations, labels = meta["annotations"], meta["labels"]
        assert annotations["ringfence.dev/execution-id"] == "Exec_42."
        assert annotations["ringfence.dev/session-id"] == "session-1"
        assert annotations["ringfence.dev/task-id"] == "task 7 (restart the api)"
        assert annotations["ringfence.dev/checkpoint-id"] == "cp0123456789abcdef0123"
        assert annotations["ringfence.dev/approved-by"] == "key-alice,key-bob"
        assert annotations["ringfence.dev/remediation-action"] == "restart-deployment"
        assert annotations["ringfence.dev/target-namespace"] == "payments"
        assert labels["ringfence.dev/execution-id"] == label_value("Exec_42.")
        assert labels["ringfence.dev/session-id"] == "session-1"
        assert labels["ringfence.dev/checkpoint-id"] == "cp0123456789abcdef0123"
        assert labels["ringfence.dev/task-id"] == label_value("task 7 (restart the api)")


def test_label_values_are_the_id_or_a_stable_digest() -> None:
    assert label_value("abc-1.2_x") == "abc-1.2_x"
    for invalid in ("Exec_42.", "a b", "x" * 64, "-lead", "key-alice,key-bob"):
        digest = label_value(invalid)
        assert digest == label_value(invalid) and digest.startswith("h-") and len(digest) <= 63
    assert label_value("a b") != label_value("a c")


def test_job_names_are_dns_labels_and_distinct_per_id() -> None:
    names = {job_name(i) for i in ("a", "A", "a_b", "a.b", "x" * 63)}
    assert len(names) == 5
    assert all(len(n) <= 63 and n == n.lower() for n in names)


def test_the_command_and_environment_are_exactly_the_request(config: Config) -> None:
    container = _job(config)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["sh", "-c"] and container["args"] == ["echo hi"]
    assert container["env"] == [{"name": "MODE", "value": "dry-run"}]
    assert container["image"] == config.kubernetes_image
    assert _job(config)["metadata"]["namespace"] == config.namespace


def test_host_mounts_and_host_directories_are_refused(config: Config) -> None:
    with pytest.raises(InvalidRequest):
        job_manifest(REQUEST.model_copy(update={"mounts": [Mount.parse("/etc:/x")]}), config)
    with pytest.raises(InvalidRequest):
        job_manifest(REQUEST.model_copy(update={"image": "/srv/rootfs"}), config)


def test_egress_rules_are_refused_rather_than_ignored(config: Config) -> None:
    allowing = NetworkPolicy(rules=[EgressRule(domain="pypi.org")])
    with pytest.raises(InvalidRequest) as caught:
        job_manifest(REQUEST.model_copy(update={"network": allowing}), config)
    assert caught.value.code == "invalid_request"
    assert_valid(job_manifest(REQUEST.model_copy(update={"network": NetworkPolicy()}), config))


def test_sandbox_pod_runs_the_daemon_on_its_port(config: Config) -> None:
    pod = pod_manifest("sb0123", "python:3.13-slim", {"K": "v"}, ResourceLimits(), config)
    assert_valid(pod)
    container = pod["spec"]["containers"][0]
    assert container["image"] == "python:3.13-slim"
    assert container["ports"][0]["containerPort"] == config.kubernetes_daemon_port
    assert "--listen-fd" in container["command"][-1]
    assert pod["metadata"]["labels"]["ringfence.dev/sandbox-id"] == "sb0123"
    (init,) = pod["spec"]["initContainers"]
    assert init["image"] == config.kubernetes_daemon_image
