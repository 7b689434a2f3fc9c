"""Job and Pod states → statuses, and the client's errors → Ringfence's (pure parts)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ringfence.backends import create_executor
from ringfence.backends._output import BoundedLog
from ringfence.backends.kubernetes._client import translate
from ringfence.backends.kubernetes.backend import execution_selector, result_from_cluster
from ringfence.backends.kubernetes.manifests import label_value
from ringfence.backends.kubernetes.status import PodPhase, job_outcome, pod_view
from ringfence.config import Config
from ringfence.errors import (
    BackendUnavailable,
    Conflict,
    DuplicateExecution,
    ExecutionNotFound,
    InvalidRequest,
    SandboxError,
)
from ringfence.models import Status


def _pod(phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": {"phase": phase, **status}}


def _terminated(code: int, reason: str = "Completed") -> dict[str, Any]:
    state = {"terminated": {"exitCode": code, "reason": reason}}
    return {"containerStatuses": [{"name": "sandbox", "state": state}]}


def _job(*conditions: tuple[str, str], deadline: int = 30) -> dict[str, Any]:
    return {
        "metadata": {"name": "rf-x-1"},
        "spec": {"activeDeadlineSeconds": deadline},
        "status": {
            "conditions": [
                {"type": kind, "status": "True", "reason": reason, "message": f"{reason}!"}
                for kind, reason in conditions
            ]
        },
    }


def test_pending_and_running_pods() -> None:
    assert pod_view(_pod("Pending")).phase is PodPhase.WAITING
    assert pod_view({"metadata": {}}).phase is PodPhase.WAITING
    assert pod_view(_pod("Running")).phase is PodPhase.RUNNING


@pytest.mark.parametrize(
    "reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerError"]
)
def test_image_failures_are_broken_at_once_with_the_reason(reason: str) -> None:
    waiting = {"waiting": {"reason": reason, "message": "pull access denied for nope"}}
    pod = _pod("Pending", containerStatuses=[{"name": "sandbox", "state": waiting}])
    view = pod_view(pod)
    assert view.phase is PodPhase.BROKEN
    assert view.error is not None and "pull access denied for nope" in view.error


def test_an_init_container_that_cannot_pull_is_broken_too() -> None:
    waiting = {"waiting": {"reason": "ImagePullBackOff"}}
    pod = _pod("Pending", initContainerStatuses=[{"name": "daemon", "state": waiting}])
    assert pod_view(pod).phase is PodPhase.BROKEN


def test_ordinary_waiting_is_not_broken() -> None:
    waiting = {"waiting": {"reason": "ContainerCreating"}}
    pod = _pod("Pending", containerStatuses=[{"name": "sandbox", "state": waiting}])
    assert pod_view(pod).phase is PodPhase.WAITING


def test_unschedulable_is_broken_with_the_schedulers_words() -> None:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes have enough memory"}  # fmt: skip
    view = pod_view(_pod("Pending", conditions=[condition]))
    assert view.phase is PodPhase.BROKEN
    assert view.error is not None and "0/3 nodes have enough memory" in view.error


def test_ended_pods_carry_the_exit_code_and_oom() -> None:
    assert pod_view(_pod("Succeeded", **_terminated(0))).exit_code == 0
    failed = pod_view(_pod("Failed", **_terminated(3, "Error")))
    assert (failed.phase, failed.exit_code, failed.error) == (PodPhase.ENDED, 3, None)
    oom = pod_view(_pod("Failed", **_terminated(137, "OOMKilled")))
    assert oom.error == "out of memory"


def test_a_running_job_has_no_outcome() -> None:
    assert job_outcome({"status": {"active": 1}}, None) is None
    assert job_outcome({}, None) is None
    unset = _job(("Failed", "BackoffLimitExceeded"))
    unset["status"]["conditions"][0]["status"] = "False"
    assert job_outcome(unset, None) is None


def test_complete_is_succeeded() -> None:
    outcome = job_outcome(_job(("Complete", "")), None)
    assert outcome is not None and (outcome.status, outcome.exit_code) == (Status.SUCCEEDED, 0)


def test_deadline_exceeded_is_timed_out() -> None:
    outcome = job_outcome(_job(("Failed", "DeadlineExceeded"), deadline=7), None)
    assert outcome is not None and outcome.status is Status.TIMED_OUT
    assert outcome.exit_code is None and "7 s" in (outcome.error or "")


def test_a_failed_pod_is_failed_with_its_exit_code() -> None:
    pod = pod_view(_pod("Failed", **_terminated(42, "Error")))
    outcome = job_outcome(_job(("Failed", "BackoffLimitExceeded")), pod)
    assert outcome is not None and (outcome.status, outcome.exit_code) == (Status.FAILED, 42)
    oom = pod_view(_pod("Failed", **_terminated(137, "OOMKilled")))
    outcome = job_outcome(_job(("Failed", "BackoffLimitExceeded")), oom)
    assert outcome is not None and outcome.error == "out of memory"
    podless = job_outcome(_job(("Failed", "BackoffLimitExceeded")), None)
    assert podless is not None and podless.error == "BackoffLimitExceeded!"


def test_results_read_from_the_cluster() -> None:
    log = BoundedLog(1024)
    log.write(b"x" * 5000)
    job = _job(("Complete", ""))
    job["status"]["startTime"] = "2026-01-01T00:00:00Z"
    result = result_from_cluster("e1", job, _pod("Succeeded", **_terminated(0)), log)
    assert (result.status, result.exit_code, result.backend) == (Status.SUCCEEDED, 0, "job")
    assert result.logs_truncated and len(result.logs.encode()) < 1200
    assert result.started_at is not None and result.job_name == "rf-x-1"
    running = result_from_cluster("e1", {"metadata": {"name": "j"}}, _pod("Running"), log)
    assert running.status is Status.RUNNING
    pending = result_from_cluster("e1", {"metadata": {"name": "j"}}, None, log)
    assert pending.status is Status.PENDING


def test_executions_are_selected_by_label() -> None:
    expected = "ringfence.dev/role=execution,ringfence.dev/execution-id=abc"
    assert execution_selector("abc") == expected
    assert label_value("A_b.") in execution_selector("A_b.")


def _api_error(status: int, reason: str = "", message: str = "said no") -> ApiException:
    error = ApiException(status=status, reason="Reason")
    error.body = json.dumps({"kind": "Status", "reason": reason, "message": message})
    return error


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (404, "NotFound", ExecutionNotFound),
        (409, "AlreadyExists", DuplicateExecution),
        (409, "Conflict", Conflict),
        (422, "Invalid", InvalidRequest),
        (400, "BadRequest", InvalidRequest),
        (403, "Forbidden", SandboxError),
        (500, "InternalError", SandboxError),
    ],
)
def test_api_errors_are_translated(status: int, reason: str, expected: type) -> None:
    error = translate("creating Job rf-x-1", _api_error(status, reason))
    assert isinstance(error, expected)
    assert "creating Job rf-x-1" in error.message


def test_unreachable_api_and_foreign_errors() -> None:
    import urllib3

    error = translate("listing", urllib3.exceptions.MaxRetryError(None, "/x", "refused"))
    assert isinstance(error, SandboxError) and "unreachable" in error.message
    assert translate("listing", KeyError("x")) is None  # a bug stays a bug
    garbled = ApiException(status=502, reason="Bad Gateway")
    garbled.body = "<html>"
    bad_gateway = translate("listing", garbled)
    assert isinstance(bad_gateway, SandboxError) and "Bad Gateway" in bad_gateway.message


def test_without_a_cluster_the_job_backend_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(BackendUnavailable) as caught:
        create_executor(Config(backend="job"))
    assert caught.value.code == "backend_unavailable"


def test_the_builders_do_not_import_the_client() -> None:
    code = (
        "import sys, ringfence.backends, ringfence.backends.kubernetes.manifests,"
        " ringfence.backends.kubernetes.cluster, ringfence.backends.kubernetes.status;"
        " print('kubernetes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
