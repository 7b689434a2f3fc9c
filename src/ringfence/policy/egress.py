"""Egress decisions: a pure function of the policy and the destination. No I/O.

A destination is decided twice. By name and port, before anything is resolved
(``decide``): deny rules win, then ask, then allow; nothing matching means deny. Then by the
addresses the name resolved to (``check_addresses``): a deny rule's CIDR still wins, the
deciding rule's CIDR (if it has one) must hold the address, and without a CIDR only public
addresses are used, so an allowed name pointed at loopback or a private network reaches
nothing of the host's. Whatever the rules, Ringfence's own endpoints (``OwnEndpoints``: its
API, its egress proxies and gate, its resolver) are never used: through them a sandbox
would act on itself with its creator's key (a configuration-based escape).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ringfence.models import EgressAction, EgressRule, NetworkMode, NetworkPolicy

__all__ = [
    "Address",
    "Network",
    "OwnEndpoints",
    "Verdict",
    "canonical_address",
    "check_addresses",
    "decide",
    "domain_matches",
    "embeds_ipv4",
    "internal_networks",
    "is_internal",
    "name_resolvable",
    "normalize_host",
    "own_endpoints",
]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Never reached through an allowed *name*: only a rule whose CIDR names them reaches these.
# The IPv6 ranges that embed an IPv4 address (mapped, IPv4-compatible, NAT64, 6to4) are
# here whole: through them an IPv4 address of the host's could be reached by another name.
_INTERNAL = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "168.63.129.16/32",
        "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16",
        "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
        "::/96", "::1/128", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16",
        "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
    )
)  # fmt: skip
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
# IPv6 addresses that reach an IPv4 address through a translator or a tunnel (IPv4-compatible,
# NAT64, 6to4): never used, whatever the rules say, as they would pass the IPv4 rules by.
_EMBEDDING_IPV4 = tuple(
    ipaddress.IPv6Network(net) for net in ("::/96", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16")
)
_LOOPBACK6 = ipaddress.IPv6Address("::1")
# Addresses that always reach this host, whatever its interfaces: a connection to 0.0.0.0 or
# :: goes to the host itself, and every address of 127.0.0.0/8 reaches a 0.0.0.0 listener.
_THIS_HOST: tuple[Network, ...] = tuple(
    ipaddress.ip_network(net) for net in ("0.0.0.0/8", "127.0.0.0/8", "::/128", "::1/128")
)


@dataclass(frozen=True)
class OwnEndpoints:
    """Where Ringfence itself listens: never a destination, whatever the rules.

    ``ports``: the ports it listens on at an address of this host; each is refused on *every*
    address of this host (``host``: loopback, unspecified, and the interfaces' addresses
    and local ranges), as a listener on 0.0.0.0 or :: answers on all of them and guessing
    which one a socket is bound to is not worth the risk. ``elsewhere``: endpoints of
    Ringfence on other hosts (another replica, a Service in front of the API), refused
    exactly. Build it with ``own_endpoints``.
    """

    ports: frozenset[int] = frozenset()
    host: tuple[Network, ...] = _THIS_HOST
    elsewhere: frozenset[tuple[Address, int]] = frozenset()

    def holds(self, address: Address, port: int) -> bool:
        """Whether ``address:port`` (as it goes on the wire) reaches Ringfence itself."""
        wire = canonical_address(address)
        if (wire, port) in self.elsewhere:
            return True
        return port in self.ports and _within(wire, self.host)


def _within(address: Address, networks: Iterable[Network]) -> bool:
    return any(address in net for net in networks if net.version == address.version)


def own_endpoints(
    listening: Iterable[tuple[Address, int]], host_networks: Iterable[Network] = ()
) -> OwnEndpoints:
    """Ringfence's own endpoints, from where it listens and the addresses of its host
    (``host_networks``: its interfaces' addresses and the ranges routed to it as local)."""
    host = tuple(dict.fromkeys((*_THIS_HOST, *host_networks)))
    ports: set[int] = set()
    elsewhere: set[tuple[Address, int]] = set()
    for address, port in listening:
        wire = canonical_address(address)
        if _within(wire, host):
            ports.add(port)
        else:
            elsewhere.add((wire, port))
    return OwnEndpoints(frozenset(ports), host, frozenset(elsewhere))


@dataclass(frozen=True)
class Verdict:
    """What the policy says of one destination, and why (the why is shown to the user)."""

    action: EgressAction
    reason: str
    rule: EgressRule | None = None
    addresses: tuple[Address, ...] = ()  # after check_addresses: the ones that may be used

    @property
    def allowed(self) -> bool:
        return self.action is EgressAction.ALLOW


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets."""
    return host.strip().lower().removesuffix(".").removeprefix("[").removesuffix("]")


def domain_matches(pattern: str, host: str) -> bool:
    """``pattern`` (``name`` or ``*.suffix``) against a normalized host name. A wildcard
    matches names below the suffix, never the suffix itself."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def canonical_address(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) as the IPv4 address it is on the
    wire, and an IPv6 one without its zone (``fd00::7%eth0``: the zone picks an interface,
    not another address, and would make it compare unequal to the same address unzoned);
    every other address as it is. Decisions are made, and connections opened, on it."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.scope_id is not None:
            return ipaddress.IPv6Address(int(address))
    return address


def embeds_ipv4(address: Address) -> bool:
    """An IPv6 address that stands for an IPv4 one behind a translator or tunnel (NAT64,
    6to4, IPv4-compatible); ``::1`` and IPv4-mapped addresses are not such."""
    if not isinstance(address, ipaddress.IPv6Address) or address == _LOOPBACK6:
        return False
    return any(address in net for net in _EMBEDDING_IPV4)


def is_internal(address: Address) -> bool:
    """Loopback, private, link-local, multicast, unspecified, special-purpose, or an IPv6
    address embedding an IPv4 one (IPv4-mapped ones are judged as the IPv4 address)."""
    address = canonical_address(address)
    return any(address in net for net in _INTERNAL if net.version == address.version)


def internal_networks(
    network: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The part of ``network`` that lies in internal ranges, as networks (empty: none)."""
    found: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for internal in _INTERNAL:
        if internal.version != network.version or not network.overlaps(internal):
            continue
        found.append(network if network.subnet_of(internal) else internal)  # type: ignore[arg-type]
    return found


def _literal(host: str) -> Address | None:
    try:
        return canonical_address(ipaddress.ip_address(host))
    except ValueError:
        return None


def _in_cidr(rule: EgressRule, address: Address) -> bool:
    """Whether the rule's CIDR holds ``address`` as it goes on the wire: a mapped address is
    IPv4, held by an IPv4 CIDR only. A deny rule also holds it as written (fail closed)."""
    if rule.cidr is None:
        return False
    network = ipaddress.ip_network(rule.cidr)
    wire = canonical_address(address)
    if rule.action is EgressAction.DENY and isinstance(wire, ipaddress.IPv4Address):
        mapped = ipaddress.IPv6Address(int(_MAPPED.network_address) | int(wire))
        return wire in network or mapped in network
    return wire in network


def _matches_name(rule: EgressRule, host: str, port: int) -> bool:
    """Does ``rule`` match by name and port (its CIDR, if any, is checked on addresses)?"""
    if port not in rule.ports:
        return False
    literal = _literal(host)
    if literal is not None:
        return rule.domain is None and _in_cidr(rule, literal)
    return rule.domain is not None and domain_matches(rule.domain, host)


def decide(policy: NetworkPolicy, host: str, port: int) -> Verdict:
    """Decide by name (or IP literal) and port, before resolving anything."""
    host = normalize_host(host)
    target = f"{host}:{port}"
    if policy.mode is NetworkMode.NONE:
        return Verdict(EgressAction.DENY, "this sandbox has no network (policy mode none)")
    literal = _literal(host)
    if literal is not None and embeds_ipv4(literal):
        return Verdict(
            EgressAction.DENY,
            f"{target} embeds an IPv4 address (NAT64, 6to4 or IPv4-compatible): never used",
        )
    matching = [rule for rule in policy.rules if _matches_name(rule, host, port)]
    for rule in matching:
        # A deny rule with a domain and a CIDR denies by address, in check_addresses.
        if rule.action is EgressAction.DENY and (rule.cidr is None or rule.domain is None):
            return Verdict(EgressAction.DENY, f"{target} is denied by a rule", rule)
    for action in (EgressAction.ASK, EgressAction.ALLOW):
        for rule in matching:
            if rule.action is action:
                return Verdict(action, f"{target} is allowed by a rule", rule)
    if _literal(host) is not None:
        return Verdict(EgressAction.DENY, f"no rule allows the address {target} (by name only)")
    return Verdict(EgressAction.DENY, f"no rule allows {target}")


def check_addresses(
    policy: NetworkPolicy,
    verdict: Verdict,
    host: str,
    port: int,
    addresses: Iterable[Address],
    *,
    own: OwnEndpoints,
) -> Verdict:
    """Narrow an allow (or approved ask) verdict to the addresses that may be used; deny
    when none is left. ``own``: Ringfence's endpoints, never used whatever the rules."""
    host = normalize_host(host)
    rule = verdict.rule
    assert rule is not None and verdict.action is not EgressAction.DENY
    wire = (canonical_address(a) for a in addresses)
    resolved = list(dict.fromkeys(a for a in wire if not embeds_ipv4(a)))
    candidates = [a for a in resolved if not own.holds(a, port)]
    if resolved and not candidates:
        return Verdict(
            EgressAction.DENY,
            f"{host}:{port} is Ringfence's own endpoint (its API, proxy or gate): never a "
            "destination",
        )
    for deny in policy.rules:
        if deny.action is not EgressAction.DENY or deny.cidr is None or port not in deny.ports:
            continue
        if deny.domain is not None and not domain_matches(deny.domain, host):
            continue
        if any(_in_cidr(deny, address) for address in candidates):
            return Verdict(EgressAction.DENY, f"{host}:{port} resolves into a denied network")
    if rule.cidr is not None:
        usable = [a for a in candidates if _in_cidr(rule, a)]
        why = f"{host} does not resolve into {rule.cidr}"
    else:
        usable = [a for a in candidates if not is_internal(a)]
        why = f"{host} resolves only to internal addresses (a rule with a cidr can allow them)"
    if not usable:
        return Verdict(EgressAction.DENY, why if candidates else f"{host} does not resolve")
    return Verdict(verdict.action, verdict.reason, rule, tuple(usable))


def name_resolvable(policy: NetworkPolicy, host: str) -> bool:
    """Whether Ringfence's resolver answers ``host`` for this sandbox: some port of some
    rule naming it would be allowed (or asked)."""
    host = normalize_host(host)
    ports: Sequence[int] = sorted(
        {p for rule in policy.rules if rule.domain and domain_matches(rule.domain, host)
         for p in rule.ports}
    )  # fmt: skip
    return any(decide(policy, host, port).action is not EgressAction.DENY for port in ports)
