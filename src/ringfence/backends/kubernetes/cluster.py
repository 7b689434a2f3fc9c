"""What an operator applies once: the sandbox namespace and its guards, and the control
plane's own Deployment (``ringfence k8s render``). Pure: settings in, manifests out.

Privileges, each the least its holder needs:
- the control plane's service account may, in the sandbox namespace only, create, watch
  and delete Jobs and Pods and read Pod logs: nothing else, nowhere else;
- the sandbox service account (whose token is not even mounted unless configured) may, in
  the target namespace only, what remediations do: read Pods and Deployments, delete Pods
  (a restart), patch Deployments and their scale (a rollout, a scale-down).

Two NetworkPolicies split the sandbox Pods by their ``ringfence.dev/egress`` label: those
without an egress policy reach DNS and the API server only; those with one
(``egress=proxy``) reach nothing but the control plane's Pods on the egress proxy's port
and its gate's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ringfence.audit.signing import KEY_FILE
from ringfence.backends.kubernetes.egress import EGRESS_LABEL
from ringfence.backends.kubernetes.manifests import MANAGED_BY, Manifest
from ringfence.config import Config

__all__ = [
    "CONTROL_PLANE",
    "CREDENTIALS_KEY_SECRET",
    "POD_IP_VARIABLE",
    "SEAL_KEY_SECRET",
    "ClusterSettings",
    "cluster_manifests",
]

CONTROL_PLANE = "ringfence-control-plane"
_PORT = 8080
_SERVICE_PORT = 80
_DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
_API_PORTS = [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]
# The replica's own Pod IP (downward API): where its sandboxes reach its egress proxy.
POD_IP_VARIABLE = "RINGFENCE_POD_IP"


@dataclass(frozen=True)
class ClusterSettings:
    """What ``render`` varies; the rest comes from ``Config``."""

    config: Config
    runtime_class: str | None = None  # "gvisor" → handler runsc; "kata" → handler kata
    target_namespace: str = "default"
    database_url: str = "postgresql+psycopg://ringfence:CHANGE-ME@postgres:5432/ringfence"
    # The audit log's seal key, as its file holds it (base64 of the Ed25519 seed). Every
    # replica must seal with the same key: a replica with another refuses to start.
    seal_key: str = ""
    # The key proposals' credentials are sealed under, as its file holds it (base64 of 32
    # bytes). Every replica must hold the same: one approves what another sealed.
    credentials_key: str = ""
    replicas: int = 2
    pods: int = 50  # sandbox Pods and Job Pods alive at once, in all
    extra_env: dict[str, str] = field(default_factory=dict)


def cluster_manifests(settings: ClusterSettings) -> list[Manifest]:
    """Every object, in the order ``kubectl apply`` needs them."""
    config = settings.config
    sandboxes, system = config.namespace, config.kubernetes_control_plane_namespace
    objects = [
        _namespace(sandboxes, restricted=True),
        _namespace(system, restricted=True),
        _service_account(sandboxes, config.service_account, automount=False),
        _service_account(system, CONTROL_PLANE, automount=True),
        *_control_plane_rbac(sandboxes, system),
        *_remediation_rbac(settings.target_namespace, sandboxes, config.service_account),
        _network_policy(sandboxes, system, config),
        _egress_network_policy(sandboxes, system, config),
        _quota(sandboxes, settings, config),
        _limit_range(sandboxes, config),
    ]
    if settings.runtime_class:
        objects.append(_runtime_class(settings.runtime_class))
    objects += [
        _config_map(system, settings),
        _secret(system, settings.database_url),
        _seal_key_secret(system, settings.seal_key),
        _key_secret(CREDENTIALS_KEY_SECRET, system, CREDENTIALS_KEY_FILE, settings.credentials_key),
        _service(system),  # before the replicas: they resolve its name when they start
        _deployment(system, settings),
    ]
    return objects


def _meta(name: str, namespace: str | None = None, **labels: str) -> Manifest:
    meta: Manifest = {"name": name, "labels": {**MANAGED_BY, **labels}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _namespace(name: str, *, restricted: bool) -> Manifest:
    level = "restricted" if restricted else "baseline"
    labels = {f"pod-security.kubernetes.io/{mode}": level for mode in ("enforce", "warn", "audit")}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name, **labels)}


def _service_account(namespace: str, name: str, *, automount: bool) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(name, namespace),
        "automountServiceAccountToken": automount,
    }


def _role(namespace: str, name: str, rules: list[Manifest]) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(name, namespace),
        "rules": rules,
    }


def _binding(namespace: str, name: str, account: str, account_namespace: str) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(name, namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}],
    }


def _control_plane_rbac(sandboxes: str, system: str) -> list[Manifest]:
    rules = [
        {
            "apiGroups": ["batch"],
            "resources": ["jobs"],
            "verbs": ["create", "get", "list", "watch", "delete"],
        },
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["create", "get", "list", "watch", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    return [
        _role(sandboxes, CONTROL_PLANE, rules),
        _binding(sandboxes, CONTROL_PLANE, CONTROL_PLANE, system),
    ]


def _remediation_rbac(target: str, sandboxes: str, account: str) -> list[Manifest]:
    name = "ringfence-remediation"
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
    ]
    return [_role(target, name, rules), _binding(target, name, account, sandboxes)]


def _control_plane_pods(system: str) -> Manifest:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": system}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": CONTROL_PLANE}},
    }


def _from_control_plane(system: str, config: Config) -> list[Manifest]:
    """Ingress: the control plane, to the daemon port (and nothing else, from nowhere else)."""
    return [
        {
            "from": [_control_plane_pods(system)],
            "ports": [{"protocol": "TCP", "port": config.kubernetes_daemon_port}],
        }
    ]


def _network_policy(sandboxes: str, system: str, config: Config) -> Manifest:
    """Sandbox Pods without an egress policy. Egress: DNS and the API server only."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta("ringfence-sandbox-isolation", sandboxes),
        "spec": {
            # Every Pod but those of the egress policy below: policies add up, so a Pod
            # both selected would reach DNS and the API server around the proxy.
            "podSelector": {
                "matchExpressions": [
                    {"key": EGRESS_LABEL, "operator": "NotIn", "values": ["proxy"]}
                ]
            },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": _from_control_plane(system, config),
            "egress": [
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                            },
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                        }
                    ],
                    "ports": _DNS_PORTS,
                },
                {
                    "to": [
                        {"ipBlock": {"cidr": cidr}} for cidr in config.kubernetes_api_server_cidrs
                    ],
                    "ports": _API_PORTS,
                },
            ],
        },
    }


def _egress_network_policy(sandboxes: str, system: str, config: Config) -> Manifest:
    """Sandbox Pods with an egress policy: their only way out is the control plane's proxy.
    No DNS (the proxy is addressed by IP and resolves for them), no API server."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta("ringfence-sandbox-egress-proxy", sandboxes),
        "spec": {
            "podSelector": {
                "matchExpressions": [{"key": EGRESS_LABEL, "operator": "In", "values": ["proxy"]}]
            },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": _from_control_plane(system, config),
            "egress": [
                {
                    "to": [_control_plane_pods(system)],
                    "ports": [
                        {"protocol": "TCP", "port": config.kubernetes_egress_proxy_port},
                        {"protocol": "TCP", "port": config.kubernetes_egress_gate_port},
                    ],
                }
            ],
        },
    }


def _quota(sandboxes: str, settings: ClusterSettings, config: Config) -> Manifest:
    limits = config.default_limits
    pods = settings.pods
    hard = {"pods": str(pods)}
    if limits.memory is not None:
        hard["requests.memory"] = hard["limits.memory"] = str(pods * limits.memory)
    if limits.cpus is not None:
        hard["requests.cpu"] = hard["limits.cpu"] = f"{round(pods * limits.cpus * 1000)}m"
    if limits.disk is not None:
        hard["requests.ephemeral-storage"] = str(pods * 2 * limits.disk)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _meta("ringfence-sandboxes", sandboxes),
        "spec": {"hard": hard},
    }


def _limit_range(sandboxes: str, config: Config) -> Manifest:
    """Defaults for any container created without limits, and the ceiling of any."""
    default, ceiling = config.default_limits, config.max_limits

    def amounts(limits: Any) -> dict[str, str]:
        out = {}
        if limits.memory is not None:
            out["memory"] = str(limits.memory)
        if limits.cpus is not None:
            out["cpu"] = f"{round(limits.cpus * 1000)}m"
        return out

    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": _meta("ringfence-sandboxes", sandboxes),
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "default": amounts(default),
                    "defaultRequest": amounts(default),
                    "max": amounts(ceiling),
                }
            ]
        },
    }


def _runtime_class(name: str) -> Manifest:
    handler = {"gvisor": "runsc", "kata": "kata"}.get(name, name)
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": _meta(name),
        "handler": handler,
    }


def _config_env(settings: ClusterSettings) -> dict[str, str]:
    config = settings.config
    service = f"{CONTROL_PLANE}.{config.kubernetes_control_plane_namespace}.svc"
    env = {
        "SANDBOX_BACKEND": "job",
        "RINGFENCE_NAMESPACE": config.namespace,
        "RINGFENCE_SERVICE_ACCOUNT": config.service_account,
        "RINGFENCE_KUBERNETES_IMAGE": config.kubernetes_image,
        "RINGFENCE_KUBERNETES_DAEMON_IMAGE": config.kubernetes_daemon_image,
        # The ports the egress NetworkPolicy opens: the replicas listen on these.
        "RINGFENCE_KUBERNETES_EGRESS_PROXY_PORT": str(config.kubernetes_egress_proxy_port),
        "RINGFENCE_KUBERNETES_EGRESS_GATE_PORT": str(config.kubernetes_egress_gate_port),
        "RINGFENCE_DATA_DIR": "/var/lib/ringfence",
        # The API's Service: never a destination of the egress proxy (its Pods' API port is
        # refused on every internal address already).
        "RINGFENCE_KUBERNETES_RESERVED_SERVICES": json.dumps([f"{service}:{_SERVICE_PORT}"]),
    }
    if settings.runtime_class:
        env["RINGFENCE_RUNTIME_CLASS_NAME"] = settings.runtime_class
    return env | settings.extra_env


def _config_map(system: str, settings: ClusterSettings) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(CONTROL_PLANE, system),
        "data": _config_env(settings),
    }


def _secret(system: str, database_url: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(CONTROL_PLANE, system),
        "type": "Opaque",
        "stringData": {"RINGFENCE_DATABASE_URL": database_url},
    }


SEAL_KEY_SECRET = "ringfence-audit-seal-key"


def _seal_key_secret(system: str, seal_key: str) -> Manifest:
    return _key_secret(SEAL_KEY_SECRET, system, KEY_FILE, seal_key)


CREDENTIALS_KEY_SECRET = "ringfence-credentials-key"
CREDENTIALS_KEY_FILE = "credentials-key"  # service/credentials.py's KEY_FILE


def _key_secret(name: str, system: str, file: str, text: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(name, system),
        "type": "Opaque",
        "stringData": {file: text.strip() + "\n"},
    }


def _deployment(system: str, settings: ClusterSettings) -> Manifest:
    selector = {"app.kubernetes.io/name": CONTROL_PLANE}
    container = {
        "name": "ringfence",
        "image": settings.config.kubernetes_daemon_image,
        "command": ["ringfence", "serve", "--host", "0.0.0.0", "--port", str(_PORT)],
        "ports": [
            {"name": "http", "containerPort": _PORT, "protocol": "TCP"},
            {
                "name": "egress-proxy",
                "containerPort": settings.config.kubernetes_egress_proxy_port,
                "protocol": "TCP",
            },
            {
                "name": "egress-gate",
                "containerPort": settings.config.kubernetes_egress_gate_port,
                "protocol": "TCP",
            },
        ],
        "env": [
            {"name": POD_IP_VARIABLE, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        ],
        "envFrom": [
            {"configMapRef": {"name": CONTROL_PLANE}},
            {"secretRef": {"name": CONTROL_PLANE}},
        ],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": "/var/lib/ringfence"},
            {
                "name": "seal-key",
                "mountPath": f"/var/lib/ringfence/{KEY_FILE}",
                "subPath": KEY_FILE,
                "readOnly": True,
            },
            {
                "name": "credentials-key",
                "mountPath": f"/var/lib/ringfence/{CREDENTIALS_KEY_FILE}",
                "subPath": CREDENTIALS_KEY_FILE,
                "readOnly": True,
            },
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(CONTROL_PLANE, system, **selector),
        "spec": {
            "replicas": settings.replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**MANAGED_BY, **selector}},
                "spec": {
                    "serviceAccountName": CONTROL_PLANE,
                    "automountServiceAccountToken": True,  # it drives the API
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "fsGroup": 10001,  # the keys' files are readable by the group
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [
                        {"name": "data", "emptyDir": {"sizeLimit": "64Mi"}},
                        {
                            "name": "seal-key",
                            "secret": {"secretName": SEAL_KEY_SECRET, "defaultMode": 0o440},
                        },
                        {
                            "name": "credentials-key",
                            "secret": {
                                "secretName": CREDENTIALS_KEY_SECRET,
                                "defaultMode": 0o440,
                            },
                        },
                        {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
                    ],
                },
            },
        },
    }


def _service(system: str) -> Manifest:
    selector = {"app.kubernetes.io/name": CONTROL_PLANE}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(CONTROL_PLANE, system),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {"name": "http", "port": _SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }
