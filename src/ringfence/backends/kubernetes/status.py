"""Job and Pod states → execution statuses. Pure: reads the API's JSON (camelCase dicts).

A Job ends with a condition: ``Complete`` (succeeded) or ``Failed`` (its reason tells a
deadline, ``DeadlineExceeded``, from a failed pod, ``BackoffLimitExceeded``). Some failures
never end a Job by themselves: an image that cannot be pulled or a Pod that cannot be
scheduled waits until the deadline. Those are read from the Pod and end the execution at
once as ``failed``, with the reason in plain words.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from ringfence.backends.kubernetes.egress import GATE_CONTAINER, GATE_SECONDS
from ringfence.models import Status

__all__ = ["Outcome", "PodPhase", "PodView", "job_outcome", "pod_view"]

CONTAINER = "sandbox"
GATE_CLOSED = (
    f"the egress proxy did not admit the pod within {GATE_SECONDS} s; its command never ran"
)
POD_DEADLINE = "the pod's deadline passed; it was killed"
# Waiting reasons that will not resolve by waiting: the image or the container's setup.
_BROKEN_WAITING = {
    "ErrImagePull": "its image cannot be pulled",
    "ImagePullBackOff": "its image cannot be pulled",
    "InvalidImageName": "its image name is invalid",
    "ErrImageNeverPull": "its image is not on the node and may not be pulled",
    "CreateContainerConfigError": "its container cannot be configured",
    "CreateContainerError": "its container cannot be created",
    "RunContainerError": "its container cannot be started",
}


class PodPhase(Enum):
    WAITING = "waiting"  # not scheduled or not started yet
    RUNNING = "running"  # the command runs
    ENDED = "ended"  # the command exited (or was killed)
    BROKEN = "broken"  # it will never run: see error


@dataclass(frozen=True)
class PodView:
    phase: PodPhase
    exit_code: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Outcome:
    status: Status
    exit_code: int | None = None
    error: str | None = None


def pod_view(pod: dict[str, Any]) -> PodView:
    """Where the Pod of an execution (or of a sandbox) is."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    containers = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        what = _BROKEN_WAITING.get(waiting.get("reason", ""))
        if what is not None:
            detail = waiting.get("message") or waiting["reason"]
            return PodView(PodPhase.BROKEN, error=f"the sandbox never started: {what} ({detail})")
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            detail = condition.get("message") or "no node fits it"
            return PodView(PodPhase.BROKEN, error=f"the sandbox cannot be scheduled: {detail}")
    if phase in ("Succeeded", "Failed"):
        return _ended(status)
    if phase == "Running":
        return PodView(PodPhase.RUNNING)
    return PodView(PodPhase.WAITING)


def _ended(status: dict[str, Any]) -> PodView:
    if status.get("reason") == "DeadlineExceeded":
        return PodView(PodPhase.ENDED, error=POD_DEADLINE)
    for container in status.get("initContainerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if container.get("name") == GATE_CONTAINER and terminated.get("exitCode", 0) != 0:
            return PodView(PodPhase.ENDED, error=GATE_CLOSED)
    for container in status.get("containerStatuses") or []:
        if container.get("name") != CONTAINER:
            continue
        terminated = (container.get("state") or {}).get("terminated") or {}
        code = terminated.get("exitCode")
        error = "out of memory" if terminated.get("reason") == "OOMKilled" else None
        return PodView(PodPhase.ENDED, exit_code=code, error=error)
    return PodView(PodPhase.ENDED, error=status.get("message") or "the pod ended unexplained")


def job_outcome(job: dict[str, Any], pod: PodView | None) -> Outcome | None:
    """How the execution ended, from the Job's conditions and its Pod; None while it runs."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        kind, reason = condition.get("type"), condition.get("reason")
        if kind == "Complete":
            return Outcome(Status.SUCCEEDED, exit_code=0)
        if kind == "Failed" and reason == "DeadlineExceeded":
            seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
            return Outcome(
                Status.TIMED_OUT,
                error=f"the deadline ({seconds} s) passed; the Job's pods were killed",
            )
        if kind == "Failed":
            if pod is not None and pod.phase is PodPhase.ENDED and pod.error != POD_DEADLINE:
                return Outcome(Status.FAILED, exit_code=pod.exit_code, error=pod.error)
            return Outcome(Status.FAILED, error=condition.get("message") or reason or "failed")
    return None
