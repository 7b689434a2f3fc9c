"""Which policy applies (the one given, else the tenant's default, else none), and what an
API client may put in one."""

from __future__ import annotations

import ipaddress

from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import EgressAction, EgressRule, NetworkMode, NetworkPolicy
from ringfence.policy.egress import internal_networks

__all__ = ["beyond_ceiling", "check_tenant_policy", "policy_for", "with_floor"]


def policy_for(tenant: str, given: NetworkPolicy | None, config: Config) -> NetworkPolicy:
    """The policy a sandbox or execution of ``tenant`` gets when it asked for ``given``:
    given, under the operator's floor (``with_floor``); else ``network_defaults[tenant]``,
    then ``network_defaults["*"]``; else no network."""
    defaults = config.network_defaults
    default = defaults.get(tenant) or defaults.get("*") or NetworkPolicy()
    return default if given is None else with_floor(given, default)


def with_floor(given: NetworkPolicy, default: NetworkPolicy) -> NetworkPolicy:
    """``given`` with the deny and ask rules of the operator's ``default`` added: an API
    client (an agent's key, say) may add what it may reach, never lift what the operator
    denied or wants a human to decide (deny wins over ask over allow). A policy without
    network stays without."""
    binding = [rule for rule in default.rules if rule.action is not EgressAction.ALLOW]
    if given.mode is NetworkMode.NONE or not binding:
        return given
    floor = {rule.key() for rule in binding}
    own = [rule for rule in given.rules if rule.key() not in floor]  # read back, resent
    return given.model_copy(update={"rules": [*own, *binding]})


def check_tenant_policy(
    policy: NetworkPolicy | None, config: Config, tenant: str | None = None
) -> None:
    """API clients are not trusted with the host: a rule's CIDR may not reach loopback or
    private networks (the host's own services, the cloud's metadata address) unless the
    operator listed them in ``network_internal_cidrs``. Deny rules may name anything, and
    so may a rule of ``tenant``'s default (the operator's own, read back and resent, or
    asked for again as E2B's "internet access"); without ``tenant`` none is exempt.

    Raises:
        InvalidRequest: a rule reaches an internal network the operator did not allow.
    """
    if policy is None:
        return
    default = policy_for(tenant, None, config).rules if tenant is not None else []
    operators = {rule.key() for rule in default}
    for index, rule in enumerate(policy.rules):
        problem = None if rule.key() in operators else beyond_ceiling(rule, config)
        if problem is not None:
            raise InvalidRequest(f"network.rules[{index}].cidr: {problem}")


def beyond_ceiling(rule: EgressRule, config: Config) -> str | None:
    """Why an API client may not give ``rule`` (None: it may): its CIDR reaches an internal
    network the operator did not list in ``network_internal_cidrs``."""
    if rule.cidr is None or rule.action is EgressAction.DENY:
        return None
    allowed = [ipaddress.ip_network(cidr, strict=False) for cidr in config.network_internal_cidrs]
    network = ipaddress.ip_network(rule.cidr)
    for internal in internal_networks(network):
        if not any(internal.subnet_of(a) for a in allowed if a.version == internal.version):  # type: ignore[arg-type]
            return (
                f"{rule.cidr} reaches {internal}, an internal network (the operator can allow "
                "it with RINGFENCE_NETWORK_INTERNAL_CIDRS)"
            )
    return None
