"""Where an execution request would run on this server, with every default filled in: what
an approver and the operator's risk policy need besides the request itself (which backend,
image, namespace and service account, the limits and egress policy in force), and what this
server cannot do of what it asks. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from ringfence.config import Config
from ringfence.models import ExecutionRequest, NetworkPolicy, ResourceLimits
from ringfence.policy.network import policy_for

__all__ = ["CLUSTER_BACKENDS", "Placement", "placement"]

CLUSTER_BACKENDS = frozenset({"job"})  # backends that run in a Kubernetes cluster


@dataclass(frozen=True)
class Placement:
    backend: str  # the server's backend (SANDBOX_BACKEND)
    cluster: bool  # the backend runs it in a Kubernetes cluster
    image: str  # the root filesystem or container image, default filled in
    namespace: str | None  # the sandbox namespace (cluster backends only)
    service_account: str | None  # the Pod's service account (cluster backends only)
    runtime_class: str | None  # the Pod's RuntimeClass (cluster backends only)
    automount_token: bool  # the service account's token is mounted (cluster backends only)
    limits: ResourceLimits  # the request's limits over the server's defaults
    timeout: float  # seconds
    network: NetworkPolicy  # in force: the request's (or the tenant's default), with the
    # operator's deny and ask rules; header values redacted
    by_operator: tuple[bool, ...]  # per rule of ``network``: the operator's, not the request's
    warnings: tuple[str, ...]  # what the approver must know this server will not do


def placement(request: ExecutionRequest, tenant: str, config: Config, backend: str) -> Placement:
    """Where ``request`` of ``tenant`` would run on a server of ``config`` and ``backend``."""
    cluster = backend in CLUSTER_BACKENDS
    network = policy_for(tenant, request.network, config)
    given = request.network.rules if request.network is not None else []
    warnings: list[str] = []
    if not cluster:
        asked = [
            f"{label} {value!r}"
            for label, value in (
                ("target namespace", request.target_namespace),
                ("namespace", request.namespace),
            )
            if value
        ]
        if asked:
            warnings.append(
                f"This server runs the {backend} backend, which cannot reach a Kubernetes "
                f"cluster: it asks for {' and '.join(asked)}, but it would run in a sandbox "
                "on this server's host, where no cluster is reachable and no namespace applies."
            )
    if backend == "process":
        warnings.append(
            "The process backend has NO isolation: the command would run as the server's own "
            "user on its host, with its files and network."
        )
    if cluster:
        image = config.kubernetes_image if request.image in (None, "host") else request.image
    else:
        image = request.image or config.default_image
    return Placement(
        backend=backend,
        cluster=cluster,
        image=image or "",
        namespace=(request.namespace or config.namespace) if cluster else None,
        service_account=config.service_account if cluster else None,
        runtime_class=config.runtime_class_name if cluster else None,
        automount_token=cluster and config.automount_service_account_token,
        limits=request.limits.merged_over(config.default_limits),
        timeout=request.timeout or config.default_timeout,
        network=network.redacted(),
        by_operator=tuple(rule not in given for rule in network.rules),
        warnings=tuple(warnings),
    )
