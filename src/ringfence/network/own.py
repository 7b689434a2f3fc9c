"""Ringfence's own endpoints on this host, read when a backend builds its egress: where it
listens (``Config.network_reserved_endpoints``, which ``ringfence serve`` extends with its
API's socket, plus what the backend itself listens on) and this host's addresses, read
from ``/proc``, for the pure ``policy.own_endpoints``.

The addresses are read once: an address the host gains later (a new interface) is not
known, but loopback and the unspecified addresses, which reach every listener on 0.0.0.0,
always are.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from pathlib import Path

from ringfence.config import Config, parse_endpoint
from ringfence.policy.egress import Address, Network, OwnEndpoints, own_endpoints

__all__ = ["host_networks", "own_endpoints_of"]

_LOCAL_ROUTE = re.compile(r"^\s*/(\d+) \w+ LOCAL$")
_TRIE_NODE = re.compile(r"^[\s|+-]*-- ([0-9.]+)$")


def host_networks(proc: Path = Path("/proc")) -> list[Network]:
    """The addresses of this network namespace: the IPv4 ``local`` routes (an interface's
    address, or a whole range routed here, ``ip route add local``) and the IPv6 addresses.

    Raises:
        OSError: ``/proc/net/fib_trie`` cannot be read (IPv6 may be absent: then none).
    """
    found: list[Network] = []
    node: str | None = None
    for line in (proc / "net" / "fib_trie").read_text().splitlines():
        if match := _TRIE_NODE.match(line):
            node = match.group(1)
        elif (match := _LOCAL_ROUTE.match(line)) and node is not None:
            found.append(ipaddress.ip_network(f"{node}/{match.group(1)}", strict=False))
    try:
        inet6 = (proc / "net" / "if_inet6").read_text().splitlines()
    except FileNotFoundError:
        inet6 = []
    for line in inet6:
        if fields := line.split():
            found.append(ipaddress.ip_network(int(fields[0], 16).to_bytes(16, "big")))
    return list(dict.fromkeys(found))


def own_endpoints_of(
    config: Config, listening: Iterable[tuple[Address, int]] = (), proc: Path = Path("/proc")
) -> OwnEndpoints:
    """Ringfence's endpoints: the configured ones and ``listening`` (the backend's own).

    Raises:
        OSError: this host's addresses cannot be read.
    """
    configured = [parse_endpoint(text) for text in config.network_reserved_endpoints]
    return own_endpoints([*configured, *listening], host_networks(proc))
