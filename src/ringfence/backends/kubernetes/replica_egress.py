"""This replica's egress for its sandbox Pods: the proxy it runs (``egress_proxy``), where
its Pods reach it (``egress.EgressProxy``), and the two moves the Job executor and the Pod
runtime make on it: ``admit`` a Pod's address with its policy, ``release`` it before the Pod
goes (docs/network.md, "Enforcement on Kubernetes").

``start_replica_egress`` is what the composition root (``ringfence.compose``) calls with the
``job`` backend: with the replica's Pod IP (``RINGFENCE_POD_IP``) it listens there, and the root
hands the egress to the executor and the runtime; without one it does nothing, and egress rules
stay refused (fail closed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from ringfence.backends.kubernetes.egress import EgressProxy
from ringfence.backends.kubernetes.egress_proxy import PodEgressProxy
from ringfence.config import Config
from ringfence.errors import InvalidRequest, SandboxError
from ringfence.models import NetworkMode, NetworkPolicy
from ringfence.network.own import own_endpoints_of
from ringfence.network.resolver import Resolver
from ringfence.network.session import EgressSession, current_requester
from ringfence.policy.egress import Address, OwnEndpoints, internal_networks

__all__ = ["ReplicaEgress", "has_rules", "replica_own_endpoints", "start_replica_egress"]

_INTERNAL = (*internal_networks(ipaddress.ip_network("0.0.0.0/0")),
             *internal_networks(ipaddress.ip_network("::/0")))  # fmt: skip


def has_rules(network: NetworkPolicy | None) -> bool:
    """Whether a Pod with ``network`` goes through the proxy (else it has no egress policy)."""
    return network is not None and network.mode is NetworkMode.RULES


@dataclass(frozen=True)
class ReplicaEgress:
    proxy: PodEgressProxy
    at: EgressProxy

    def admit(self, pod_ip: str, network: NetworkPolicy, owner: str) -> None:
        """Connections from ``pod_ip`` follow ``network`` from now on, on behalf of the
        requester of the current task (``service``'s ``requesting``); ``owner``: the Pod's
        ``execution:<id>`` or ``sandbox:<id>``, which its gate names.

        Raises:
            SandboxError: the address is still another sandbox's (never shared).
        """
        requester = current_requester()
        if not requester.subject:
            requester = dataclasses.replace(requester, subject=owner)
        try:
            self.proxy.register(pod_ip, EgressSession(requester, network), owner)
        except ValueError as exc:
            raise SandboxError(f"egress: cannot admit the pod's address: {exc}") from exc

    async def release(self, pod_ip: str) -> None:
        """Forget ``pod_ip`` and cut its connections (before its Pod is deleted)."""
        await self.proxy.unregister(pod_ip)


async def start_replica_egress(config: Config) -> ReplicaEgress | None:
    """Start the proxy and its gate on the replica's Pod IP; None without a Pod IP. Its
    caller hands it to the Job executor (``use_egress``, which closes it from then on) and
    the Pod runtime.

    Raises:
        InvalidRequest: TLS interception is configured (no CA reaches sandbox Pods).
        OSError: it cannot listen there, or a reserved Service does not resolve.
    """
    if config.pod_ip is None:
        return None
    if config.network_intercept:
        raise InvalidRequest(
            "RINGFENCE_NETWORK_INTERCEPT: the job backend cannot intercept TLS (no Ringfence "
            "CA is trusted inside sandbox Pods); unset it (headers then go on plain HTTP only)"
        )
    address = str(config.pod_ip)
    listening = [(config.pod_ip, config.kubernetes_egress_proxy_port),
                 (config.pod_ip, config.kubernetes_egress_gate_port)]  # fmt: skip
    own = await replica_own_endpoints(config, listening)
    proxy = PodEgressProxy(Resolver(config.network_hosts), own=own)
    try:
        port = await proxy.start(address, config.kubernetes_egress_proxy_port)
        gate = await proxy.start_gate(address, config.kubernetes_egress_gate_port)
    except BaseException:
        await proxy.aclose()
        raise
    return ReplicaEgress(proxy, EgressProxy(address, port, gate))


async def replica_own_endpoints(
    config: Config, listening: list[tuple[Address, int]], proc: Path = Path("/proc")
) -> OwnEndpoints:
    """Ringfence's endpoints as a replica sees them. Every replica listens on the same
    ports (its API's, ``listening``'s), so these are refused on *every* internal address,
    not only this Pod's: another replica's Pod IP is one. The Services in front of the API
    (``kubernetes_reserved_services``; a Service's port may differ from its Pods') are
    refused at the addresses their names resolve to now (a ClusterIP is stable).

    Raises:
        OSError: this host's addresses cannot be read, or a Service does not resolve.
    """
    loop = asyncio.get_running_loop()
    services: list[tuple[Address, int]] = []
    for text in config.kubernetes_reserved_services:
        name, _, port = text.strip().rpartition(":")
        try:
            infos = await loop.getaddrinfo(name.strip("[]"), int(port), type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise OSError(
                f"kubernetes_reserved_services: {text!r} does not resolve: {exc}"
            ) from exc
        services += [(ipaddress.ip_address(str(info[4][0]).partition("%")[0]), int(port))
                     for info in infos]  # fmt: skip
    own = own_endpoints_of(config, [*listening, *services], proc)
    return dataclasses.replace(own, host=tuple(dict.fromkeys((*own.host, *_INTERNAL))))
