"""Egress decisions: a pure function of the policy and the destination. No I/O.

A destination is decided twice. By name and port, before anything is resolved
(``decide``): deny rules win, then ask, then allow; nothing matching means deny. Then by the
addresses the name resolved to (``check_addresses``): a deny rule's CIDR still wins, the
deciding rule's CIDR (if it has one) must hold the address, and without a CIDR only public
addresses are used, so an allowed name pointed at loopback or a private network reaches
nothing of the host's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ringfence.models import EgressAction, EgressRule, NetworkMode, NetworkPolicy

__all__ = [
    "Address",
    "Verdict",
    "check_addresses",
    "decide",
    "domain_matches",
    "internal_networks",
    "is_internal",
    "name_resolvable",
    "normalize_host",
]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Never reached through an allowed *name*: only a rule whose CIDR names them reaches these.
_INTERNAL = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
        "::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8",
    )
)  # fmt: skip


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


def is_internal(address: Address) -> bool:
    """Loopback, private, link-local, multicast or unspecified (IPv4-mapped included)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
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
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _in_cidr(rule: EgressRule, address: Address) -> bool:
    return rule.cidr is not None and address in ipaddress.ip_network(rule.cidr)


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
    policy: NetworkPolicy, verdict: Verdict, host: str, port: int, addresses: Iterable[Address]
) -> Verdict:
    """Narrow an allow (or approved ask) verdict to the addresses that may be used; deny
    when none is left."""
    host = normalize_host(host)
    rule = verdict.rule
    assert rule is not None and verdict.action is not EgressAction.DENY
    candidates = list(dict.fromkeys(addresses))
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
