"""A network policy → what a sandbox Pod needs to use the control plane's egress proxy.
Pure: the Job and Pod builders (``manifests``) merge it into their objects.

On Kubernetes the proxy is the one in the control-plane replica that runs the sandbox
(docs/network.md, "Enforcement on Kubernetes"). A Pod whose policy has rules:

- is labelled ``ringfence.dev/egress=proxy``: the sandbox NetworkPolicy for such Pods
  (``cluster``) allows egress only to the control plane's Pods, on the proxy port: no DNS,
  no API server, nothing else;
- has ``HTTP(S)_PROXY`` pointing at its replica's proxy by IP address (nothing to resolve),
  and ``NO_PROXY`` for loopback only;
- resolves nothing: its only name server is its own loopback, where nothing listens, so a
  tool that resolves a name itself fails at once instead of waiting on a dropped packet
  (proxied tools hand the name to the proxy, which decides it);
- carries the owner of the policy (``sandbox:<id>`` or ``execution:<id>``) and the proxy
  it was given in annotations, for operators and for a replica taking over.

The proxy tells which sandbox a connection comes from by its source address: the Pod IP,
which the replica that created the Pod learns from its watch (``egress_proxy``). A Job's
command starts with its container, before that: its Pod also gets a gate, an init container
that waits (bounded) until the proxy admits its address (``gate_command``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from ringfence.errors import InvalidRequest
from ringfence.models import NetworkMode, NetworkPolicy

__all__ = [
    "EGRESS_GATE_PORT",
    "EGRESS_LABEL",
    "EGRESS_OWNER_ANNOTATION",
    "EGRESS_PROXY_ANNOTATION",
    "EGRESS_PROXY_PORT",
    "GATE_CONTAINER",
    "GATE_SECONDS",
    "EgressProxy",
    "PodEgress",
    "gate_command",
    "pod_egress",
]

DOMAIN = "ringfence.dev"
EGRESS_LABEL = f"{DOMAIN}/egress"  # "proxy": its only way out; "none": no egress policy
EGRESS_OWNER_ANNOTATION = f"{DOMAIN}/egress-owner"
EGRESS_PROXY_ANNOTATION = f"{DOMAIN}/egress-proxy"
EGRESS_PROXY_PORT = 3128
EGRESS_GATE_PORT = 3129  # where a Job's Pod asks whether the proxy admits it yet
GATE_CONTAINER = "egress-gate"
GATE_SECONDS = 60  # a Job's Pod not admitted by then fails, its command never started
_NO_PROXY = "localhost,127.0.0.1,::1"


@dataclass(frozen=True)
class EgressProxy:
    """Where a sandbox Pod reaches its egress proxy: the IP address of the control-plane
    replica that runs it (a Service would spread its connections over replicas that do not
    hold its policy), and the proxy's port."""

    address: str
    port: int = EGRESS_PROXY_PORT
    gate_port: int = EGRESS_GATE_PORT

    def __post_init__(self) -> None:
        ipaddress.ip_address(self.address)  # raises ValueError: an address, not a name

    @property
    def url(self) -> str:
        host = self.address if ":" not in self.address else f"[{self.address}]"
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class PodEgress:
    """What the builders add to a sandbox Pod for its policy."""

    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    pod_spec: dict[str, object] = field(default_factory=dict)


def pod_egress(network: NetworkPolicy | None, owner: str, proxy: EgressProxy | None) -> PodEgress:
    """The labels, annotations, variables and pod-spec fields for ``network``.

    ``owner``: ``sandbox:<id>`` or ``execution:<id>``. ``proxy``: the replica's proxy, or
    None where this process runs none.

    Raises:
        InvalidRequest: the policy has rules and there is no proxy to enforce them (never a
            sandbox that ignores its policy).
    """
    if network is None or network.mode is NetworkMode.NONE:
        return PodEgress(labels={EGRESS_LABEL: "none"})
    if proxy is None:
        raise InvalidRequest(
            "network: the job backend does not enforce egress rules here: this replica runs "
            "no egress proxy (RINGFENCE_POD_IP is unset; docs/kubernetes.md, Egress); its "
            "sandboxes reach only the API server and DNS"
        )
    url = proxy.url
    return PodEgress(
        labels={EGRESS_LABEL: "proxy"},
        annotations={EGRESS_OWNER_ANNOTATION: owner, EGRESS_PROXY_ANNOTATION: url},
        env={
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": _NO_PROXY,
            "no_proxy": _NO_PROXY,
        },
        pod_spec={"dnsPolicy": "None", "dnsConfig": _nowhere_dns()},
    )


def _nowhere_dns() -> dict[str, object]:
    """The Pod's only name server: its own loopback, where nothing answers (refused at once)."""
    return {
        "nameservers": ["127.0.0.1"],
        "searches": [],
        "options": [{"name": "attempts", "value": "1"}, {"name": "timeout", "value": "1"}],
    }


# The gate: the init container of a Job with egress rules. It asks the replica's gate, by
# the execution's owner, until the proxy has registered the Pod's address for it, so the
# command (in the next container) starts with its network in place. Standard-library Python
# (Ringfence's image), a bounded wait, and a non-zero exit (the Pod fails) when not admitted.
_GATE = """\
import socket, sys, time
host, port, owner, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        with socket.create_connection((host, port), timeout=2) as s:
            s.sendall(owner.encode() + b"\\n")
            if s.makefile("rb").readline(16) == b"open\\n":
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(f"egress gate: the proxy did not admit this pod within {seconds:g} s")
"""


def gate_command(proxy: EgressProxy, owner: str, seconds: float = GATE_SECONDS) -> list[str]:
    """The gate's command: exits 0 once ``proxy`` admits ``owner`` from this Pod's address."""
    return [
        "python3", "-I", "-S", "-B", "-c", _GATE,
        proxy.address, str(proxy.gate_port), owner, f"{seconds:g}",
    ]  # fmt: skip
