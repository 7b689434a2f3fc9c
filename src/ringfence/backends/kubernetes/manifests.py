"""Policy → Kubernetes objects: the Job of a one-shot execution and the Pod of an
interactive sandbox. Pure functions over plain dicts (the API's JSON), tested without a
cluster against the official schemas.

Both shapes share one pod spec, which carries every protection of the design: no restarts,
a deadline, the sandbox service account without its token unless configured, a non-root
user, seccomp RuntimeDefault, no privilege escalation, no capabilities, a read-only root
filesystem with size-limited emptyDirs as the only writable places, resource limits, and
the optional RuntimeClass (gVisor, Kata). A network policy with rules makes the control
plane's egress proxy the Pod's only way out (``egress``), or is refused where no proxy runs.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from ringfence.backends.kubernetes.egress import (
    EGRESS_LABEL,
    GATE_CONTAINER,
    EgressProxy,
    PodEgress,
    gate_command,
    pod_egress,
)
from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ExecutionRequest, NetworkPolicy, ResourceLimits

__all__ = [
    "DAEMON_MOUNT",
    "DOMAIN",
    "EXECUTION_LABEL",
    "MANAGED_BY",
    "ROLE_LABEL",
    "SANDBOX_LABEL",
    "WORKSPACE",
    "job_manifest",
    "job_name",
    "label_value",
    "pod_manifest",
    "sandbox_pod_name",
]

Manifest = dict[str, Any]

DOMAIN = "ringfence.dev"
MANAGED_BY = {"app.kubernetes.io/managed-by": "ringfence"}
ROLE_LABEL = f"{DOMAIN}/role"  # "execution" or "sandbox"
EXECUTION_LABEL = f"{DOMAIN}/execution-id"
SANDBOX_LABEL = f"{DOMAIN}/sandbox-id"
WORKSPACE = "/workspace"
DAEMON_MOUNT = "/run/ringfence"  # the daemon package, copied in by the init container
_CONTAINER = "sandbox"
_GRACE_SECONDS = 5
# Where the ids of the founding design go: annotations always (any text), and a label
# (selectable) holding the id itself when it is a valid label value, else its digest.
_IDS = ("session_id", "task_id", "checkpoint_id", "approved_by", "remediation_action")
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")


def label_value(text: str) -> str:
    """``text`` if it is a valid label value, else ``h-`` and a digest of it (stable)."""
    if _LABEL_VALUE.match(text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def job_name(execution_id: str) -> str:
    """The Job's name: a DNS label derived from the id (ids may hold capitals and ``_``)."""
    return "rf-x-" + hashlib.sha256(execution_id.encode()).hexdigest()[:32]


def sandbox_pod_name(sandbox_id: str) -> str:
    return "rf-s-" + hashlib.sha256(sandbox_id.encode()).hexdigest()[:32]


def job_manifest(
    request: ExecutionRequest, config: Config, egress_proxy: EgressProxy | None = None
) -> Manifest:
    """The Job that runs ``request`` once. ``egress_proxy``: where its Pod reaches the
    control plane's proxy, if one runs (needed for a network policy with rules).

    Raises:
        InvalidRequest: the request asks for what a Job cannot honour (host mounts, a
            directory as root filesystem, egress rules without a proxy).
    """
    if request.mounts:
        raise InvalidRequest("mounts: the job backend cannot grant host paths to a sandbox")
    egress = pod_egress(request.network, f"execution:{request.id}", egress_proxy)
    namespace = request.namespace or config.namespace
    timeout = request.timeout or config.default_timeout
    limits = request.limits.merged_over(config.default_limits)
    labels = {
        **MANAGED_BY,
        ROLE_LABEL: "execution",
        EXECUTION_LABEL: label_value(request.id),
        **{f"{DOMAIN}/{key.replace('_', '-')}": label_value(value) for key, value in _ids(request)},
        **egress.labels,
    }
    annotations = {f"{DOMAIN}/execution-id": request.id} | {
        f"{DOMAIN}/{key.replace('_', '-')}": value for key, value in _ids(request)
    }
    annotations |= egress.annotations
    if request.target_namespace:
        annotations[f"{DOMAIN}/target-namespace"] = request.target_namespace
    container: Manifest = {
        "name": _CONTAINER,
        "image": image_of(request.image, config),
        "command": list(request.command),
        "args": list(request.args),
        "env": _env(egress, request.env),
        "workingDir": request.cwd or WORKSPACE,
        **_hardened_container(limits),
    }
    pod_spec = _pod_spec(container, limits, config, deadline=timeout) | egress.pod_spec
    if egress.labels.get(EGRESS_LABEL) == "proxy" and egress_proxy is not None:
        # The command starts with its container: before it, wait until the replica's proxy
        # admits this Pod's address (bounded; not admitted: the Pod fails, nothing ran).
        owner = f"execution:{request.id}"
        pod_spec["initContainers"] = [_gate(egress_proxy, owner, config)]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(request.id),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": _seconds(timeout),
            "ttlSecondsAfterFinished": config.ttl_seconds_after_finished,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def pod_manifest(
    sandbox_id: str,
    image: str | None,
    env: dict[str, str],
    limits: ResourceLimits,
    config: Config,
    *,
    network: NetworkPolicy | None = None,
    egress_proxy: EgressProxy | None = None,
) -> Manifest:
    """The Pod of an interactive sandbox: the daemon listening on the daemon port.
    ``network`` and ``egress_proxy``: as for ``job_manifest``.

    The daemon is standard-library Python: an init container copies it from Ringfence's
    image into a volume the sandbox container sees read-only, so the sandbox image needs
    only python3. The Pod's deadline is ``max_timeout``, a backstop: the control plane kills
    the sandbox at its own (movable) timeout, which a Pod's deadline could not follow.

    Raises:
        InvalidRequest: the image is a host directory; egress rules without a proxy.
    """
    egress = pod_egress(network, f"sandbox:{sandbox_id}", egress_proxy)
    labels = {
        **MANAGED_BY, ROLE_LABEL: "sandbox", SANDBOX_LABEL: label_value(sandbox_id),
        **egress.labels,
    }  # fmt: skip
    port = config.kubernetes_daemon_port
    boot = (
        "import socket, sys; "
        f"s = socket.create_server(('', {port}), backlog=128); "
        f"sys.path.insert(0, {DAEMON_MOUNT!r}); "
        "from sandboxd._main import main; "
        "sys.exit(main(['--listen-fd', str(s.fileno())]))"
    )
    sandbox: Manifest = {
        "name": _CONTAINER,
        "image": image_of(image, config),
        "command": ["python3", "-I", "-S", "-B", "-c", boot],
        "env": _env(egress, env),
        "workingDir": WORKSPACE,
        "ports": [{"name": "daemon", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
        **_hardened_container(limits),
    }
    sandbox["volumeMounts"].append({"name": "daemon", "mountPath": DAEMON_MOUNT, "readOnly": True})
    copier: Manifest = {
        "name": "daemon",
        "image": config.kubernetes_daemon_image,
        "command": [
            "python3",
            "-c",
            "import os, shutil, ringfence.sandboxd as d; "
            f"shutil.copytree(os.path.dirname(d.__file__), {DAEMON_MOUNT + '/sandboxd'!r})",
        ],
        **_hardened_container(ResourceLimits(memory=64 << 20, cpus=0.5, disk=16 << 20)),
    }
    copier["volumeMounts"] = [{"name": "daemon", "mountPath": DAEMON_MOUNT}]
    spec = _pod_spec(sandbox, limits, config, deadline=config.max_timeout) | egress.pod_spec
    spec["initContainers"] = [copier]
    spec["volumes"].append({"name": "daemon", "emptyDir": {"sizeLimit": "16Mi"}})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": sandbox_pod_name(sandbox_id),
            "namespace": config.namespace,
            "labels": labels,
            "annotations": {f"{DOMAIN}/sandbox-id": sandbox_id, **egress.annotations},
        },
        "spec": spec,
    }


def _gate(proxy: EgressProxy, owner: str, config: Config) -> Manifest:
    """The init container that holds a Job's command until the proxy admits its Pod."""
    gate: Manifest = {
        "name": GATE_CONTAINER,
        "image": config.kubernetes_daemon_image,  # Ringfence's: python3, whatever the job's
        "command": gate_command(proxy, owner),
        **_hardened_container(ResourceLimits(memory=32 << 20, cpus=0.1, disk=1 << 20)),
    }
    gate["volumeMounts"] = []
    return gate


def image_of(image: str | None, config: Config) -> str:
    """The container image for a request's ``image`` ('host' and unset: the default).

    Raises:
        InvalidRequest: a host directory, which only the local backend can use.
    """
    if image is None or image == "host":
        return config.kubernetes_image
    if image.startswith("/"):
        raise InvalidRequest(
            f"image: {image} is a host directory; the job backend runs container images"
        )
    return image


def _env(egress: PodEgress, env: dict[str, str]) -> list[Manifest]:
    """The container's variables: the proxy's, then the request's own (as on ``local``)."""
    merged = {**egress.env, **env}
    return [{"name": name, "value": value} for name, value in sorted(merged.items())]


def _ids(request: ExecutionRequest) -> list[tuple[str, str]]:
    return [(key, value) for key in _IDS if (value := getattr(request, key))]


def _hardened_container(limits: ResourceLimits) -> Manifest:
    return {
        "resources": _resources(limits),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "workspace", "mountPath": WORKSPACE},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _resources(limits: ResourceLimits) -> Manifest:
    """Requests equal to limits: the Pod is Guaranteed and never overcommits its node."""
    amounts: dict[str, str] = {}
    if limits.memory is not None:
        amounts["memory"] = str(limits.memory)
    if limits.cpus is not None:
        amounts["cpu"] = f"{max(1, round(limits.cpus * 1000))}m"
    if limits.disk is not None:
        amounts["ephemeral-storage"] = str(2 * limits.disk)  # the two emptyDirs
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _pod_spec(
    container: Manifest, limits: ResourceLimits, config: Config, *, deadline: float
) -> Manifest:
    uid = config.kubernetes_run_as_user
    size = {"sizeLimit": str(limits.disk)} if limits.disk is not None else {}
    spec: Manifest = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": _seconds(deadline),
        "terminationGracePeriodSeconds": _GRACE_SECONDS,
        "serviceAccountName": config.service_account,
        "automountServiceAccountToken": config.automount_service_account_token,
        "enableServiceLinks": False,  # no other Services' addresses in the environment
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "workspace", "emptyDir": dict(size)},
            {"name": "tmp", "emptyDir": dict(size)},
        ],
    }
    if config.runtime_class_name:
        spec["runtimeClassName"] = config.runtime_class_name
    return spec


def _seconds(timeout: float) -> int:
    return max(1, math.ceil(timeout))
