"""The egress policy as data (validation) and as decisions (pure functions)."""

from __future__ import annotations

import ipaddress

import pytest
from pydantic import ValidationError

from ringfence.models import EgressAction, EgressRule, NetworkMode, NetworkPolicy
from ringfence.policy.egress import (
    OwnEndpoints,
    check_addresses,
    decide,
    domain_matches,
    is_internal,
    name_resolvable,
)

PUBLIC = ipaddress.ip_address("203.0.113.80")
OTHER_PUBLIC = ipaddress.ip_address("198.51.100.7")
LOOPBACK = ipaddress.ip_address("127.0.0.1")
NONE_OWN = OwnEndpoints()  # Ringfence listens nowhere these tests look


def policy(*rules: dict[str, object]) -> NetworkPolicy:
    return NetworkPolicy.model_validate({"mode": "rules", "rules": list(rules)})


# -- validation --------------------------------------------------------------------------------


def test_no_policy_means_no_network() -> None:
    assert NetworkPolicy().mode is NetworkMode.NONE
    verdict = decide(NetworkPolicy(), "pypi.org", 443)
    assert verdict.action is EgressAction.DENY
    assert "no network" in verdict.reason


def test_rules_imply_the_rules_mode_and_mode_none_takes_none() -> None:
    assert (
        NetworkPolicy.model_validate({"rules": [{"domain": "a.example"}]}).mode is NetworkMode.RULES
    )
    with pytest.raises(ValidationError):
        NetworkPolicy.model_validate({"mode": "none", "rules": [{"domain": "a.example"}]})


@pytest.mark.parametrize(
    "rule",
    [
        {"domain": "*"},
        {"domain": "*.com"},
        {"domain": "*.*.example.com"},
        {"domain": "a.*.example.com"},
        {"domain": "exa mple.com"},
        {"domain": "-bad.example"},
        {"domain": "é.example"},
        {"cidr": "0.0.0.0/0"},
        {"cidr": "10.0.0.0/7"},
        {"cidr": "::/0"},
        {"cidr": "2001:db8::/31"},
        {"cidr": "not-an-address"},
        {},
        {"domain": "a.example", "ports": []},
        {"domain": "a.example", "ports": [0]},
        {"domain": "a.example", "ports": [65536]},
        {"domain": "a.example", "action": "deny", "headers": {"X-Token": "t"}},
        {"domain": "a.example", "action": "ask", "headers": {"X-Token": "t"}},
        {"domain": "a.example", "headers": {"Host": "evil.example"}},
        {"domain": "a.example", "headers": {"Bad Name": "x"}},
        {"domain": "a.example", "headers": {"X-Token": "a\r\nInjected: yes"}},
        {"domain": "a.example", "action": "maybe"},
        {"domain": "a.example", "extra": 1},
    ],
)
def test_broad_or_malformed_rules_are_refused(rule: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        EgressRule.model_validate(rule)


def test_domains_are_normalized_and_cidrs_canonical() -> None:
    rule = EgressRule.model_validate(
        {"domain": " *.PythonHosted.ORG. ", "cidr": "10.1.2.3/8", "ports": [443, 80, 443]}
    )
    assert rule.domain == "*.pythonhosted.org"
    assert rule.cidr == "10.0.0.0/8"
    assert rule.ports == [80, 443]


def test_redacted_hides_header_values_only() -> None:
    p = policy({"domain": "api.example", "headers": {"Authorization": "Bearer s3cret"}})
    shown = p.redacted()
    assert shown.rules[0].headers == {"Authorization": "<redacted>"}
    assert "s3cret" not in shown.model_dump_json()
    assert p.rules[0].headers["Authorization"] == "Bearer s3cret"


# -- matching ----------------------------------------------------------------------------------


def test_wildcards_match_below_the_suffix_only() -> None:
    assert domain_matches("*.example.com", "a.example.com")
    assert domain_matches("*.example.com", "a.b.example.com")
    assert not domain_matches("*.example.com", "example.com")
    assert not domain_matches("*.example.com", "badexample.com")
    assert domain_matches("example.com", "example.com")
    assert not domain_matches("example.com", "a.example.com")


def test_an_empty_rule_list_allows_nothing() -> None:
    empty = NetworkPolicy(mode=NetworkMode.RULES)
    verdict = decide(empty, "pypi.org", 443)
    assert verdict.action is EgressAction.DENY
    assert verdict.reason == "no rule allows pypi.org:443"
    assert not name_resolvable(empty, "pypi.org")


def test_exact_domain_and_port() -> None:
    p = policy({"domain": "pypi.org", "ports": [443]})
    assert decide(p, "pypi.org", 443).allowed
    assert decide(p, "PyPI.org.", 443).allowed
    assert not decide(p, "pypi.org", 80).allowed
    assert not decide(p, "evil.pypi.org", 443).allowed
    assert not decide(p, "pypi.org.evil.example", 443).allowed


def test_deny_wins_over_allow_and_ask() -> None:
    p = policy(
        {"domain": "*.example.com"},
        {"domain": "secret.example.com", "action": "deny"},
        {"domain": "secret.example.com", "action": "ask"},
    )
    assert decide(p, "www.example.com", 443).allowed
    verdict = decide(p, "secret.example.com", 443)
    assert verdict.action is EgressAction.DENY
    assert verdict.rule is not None and verdict.rule.action is EgressAction.DENY


def test_ask_wins_over_allow() -> None:
    p = policy({"domain": "*.example.com"}, {"domain": "pay.example.com", "action": "ask"})
    assert decide(p, "pay.example.com", 443).action is EgressAction.ASK
    assert decide(p, "www.example.com", 443).action is EgressAction.ALLOW


def test_ip_literals_need_a_cidr_rule() -> None:
    by_name = policy({"domain": "example.com"})
    assert not decide(by_name, "203.0.113.80", 443).allowed
    assert "by name only" in decide(by_name, "203.0.113.80", 443).reason
    by_cidr = policy({"cidr": "203.0.113.0/24", "ports": [443]})
    assert decide(by_cidr, "203.0.113.80", 443).allowed
    assert not decide(by_cidr, "198.51.100.7", 443).allowed
    assert not decide(by_cidr, "[2001:db8::1]", 443).allowed


def test_a_name_resolving_to_internal_addresses_is_denied_without_a_cidr() -> None:
    p = policy({"domain": "rebind.example"})
    verdict = decide(p, "rebind.example", 443)
    assert (
        check_addresses(p, verdict, "rebind.example", 443, [LOOPBACK], own=NONE_OWN).action
        is EgressAction.DENY
    )
    mixed = check_addresses(p, verdict, "rebind.example", 443, [LOOPBACK, PUBLIC], own=NONE_OWN)
    assert mixed.allowed and mixed.addresses == (PUBLIC,)


def test_a_cidr_on_an_allow_rule_confines_the_addresses() -> None:
    p = policy({"domain": "svc.test", "cidr": "127.0.0.1/32"})
    verdict = decide(p, "svc.test", 80)
    assert check_addresses(p, verdict, "svc.test", 80, [LOOPBACK], own=NONE_OWN).addresses == (
        LOOPBACK,
    )
    outside = check_addresses(p, verdict, "svc.test", 80, [PUBLIC], own=NONE_OWN)
    assert outside.action is EgressAction.DENY and "127.0.0.1/32" in outside.reason


def test_a_deny_cidr_wins_after_resolution() -> None:
    p = policy(
        {"domain": "*.example.com"},
        {"cidr": "203.0.113.0/24", "action": "deny"},
    )
    verdict = decide(p, "www.example.com", 443)
    assert verdict.allowed
    denied = check_addresses(
        p, verdict, "www.example.com", 443, [PUBLIC, OTHER_PUBLIC], own=NONE_OWN
    )
    assert denied.action is EgressAction.DENY
    assert check_addresses(p, verdict, "www.example.com", 443, [OTHER_PUBLIC], own=NONE_OWN).allowed


def test_an_unresolvable_name_is_denied() -> None:
    p = policy({"domain": "gone.example"})
    verdict = decide(p, "gone.example", 443)
    denied = check_addresses(p, verdict, "gone.example", 443, [], own=NONE_OWN)
    assert denied.action is EgressAction.DENY and "does not resolve" in denied.reason


@pytest.mark.parametrize(
    ("address", "internal"),
    [
        ("127.0.0.1", True), ("10.1.2.3", True), ("172.16.0.1", True), ("192.168.1.1", True),
        ("169.254.169.254", True), ("100.64.0.1", True), ("0.0.0.0", True), ("224.0.0.1", True),
        ("::1", True), ("fd00::1", True), ("fe80::1", True), ("::ffff:127.0.0.1", True),
        ("203.0.113.80", False), ("8.8.8.8", False), ("2001:db8::1", False),
    ],
)  # fmt: skip
def test_internal_addresses(address: str, internal: bool) -> None:
    assert is_internal(ipaddress.ip_address(address)) is internal


def test_the_resolver_answers_only_names_some_rule_allows() -> None:
    p = policy(
        {"domain": "*.example.com", "ports": [443]},
        {"domain": "blocked.example.com", "action": "deny"},
        {"domain": "ask.example.org", "action": "ask"},
    )
    assert name_resolvable(p, "www.example.com")
    assert name_resolvable(p, "ask.example.org")
    assert not name_resolvable(p, "blocked.example.com")
    assert not name_resolvable(p, "example.com")
    assert not name_resolvable(p, "evil.example")


def test_a_request_without_a_policy_hashes_as_before_policies_existed() -> None:
    import hashlib
    import json

    from ringfence.models import ExecutionRequest, request_digest

    request = ExecutionRequest(id="r1", command=["kubectl", "scale"], args=["--replicas=3"])
    dumped = request.model_dump(mode="json")
    assert "network" not in dumped, "approvals of proposals stored earlier must still match"
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":")).encode()
    assert request_digest(request) == hashlib.sha256(canonical).hexdigest()
    with_policy = request.model_copy(update={"network": policy({"domain": "a.example"})})
    assert request_digest(with_policy) != request_digest(request)


def test_tenants_may_name_only_the_internal_networks_the_operator_allows() -> None:
    from ringfence.config import Config
    from ringfence.errors import InvalidRequest
    from ringfence.policy.network import check_tenant_policy

    none_allowed, mirror = Config(), Config(network_internal_cidrs=["10.20.0.0/16"])
    for cidr in ("127.0.0.1/32", "10.0.0.0/8", "169.254.169.254/32", "0.0.0.0/8", "fe80::/64"):
        with pytest.raises(InvalidRequest):
            check_tenant_policy(policy({"cidr": cidr}), none_allowed)
    check_tenant_policy(policy({"cidr": "203.0.113.0/24"}), none_allowed)
    check_tenant_policy(policy({"cidr": "10.0.0.0/8", "action": "deny"}), none_allowed)
    check_tenant_policy(policy({"domain": "mirror.internal", "cidr": "10.20.1.0/24"}), mirror)
    with pytest.raises(InvalidRequest):
        check_tenant_policy(policy({"cidr": "10.0.0.0/8"}), mirror)
    check_tenant_policy(None, none_allowed)


def test_the_operators_deny_and_ask_rules_bind_every_policy_of_the_tenant() -> None:
    from ringfence.config import Config
    from ringfence.policy.network import policy_for

    operator = policy(
        {"domain": "secrets.test", "action": "deny"},
        {"domain": "*.review.test", "action": "ask"},
        {"domain": "pypi.org"},
    )
    config = Config(network_defaults={"acme": operator}, pool_sizes={})
    # An agent's own policy that tries to lift both (by creating, or by a live change).
    agents = policy({"domain": "secrets.test"}, {"domain": "*.review.test"}, {"domain": "ok.test"})
    effective = policy_for("acme", agents, config)
    assert decide(effective, "secrets.test", 443).action is EgressAction.DENY
    assert decide(effective, "x.review.test", 443).action is EgressAction.ASK
    assert decide(effective, "ok.test", 443).action is EgressAction.ALLOW
    assert decide(effective, "pypi.org", 443).action is EgressAction.DENY, "allows are not added"
    assert policy_for("acme", effective, config) == effective, "read back and resent: the same"
    assert policy_for("acme", NetworkPolicy(), config) == NetworkPolicy(), "no network stays none"
    assert policy_for("globex", agents, config) == agents, "another tenant's floor is its own"


async def test_a_sandbox_cannot_flood_the_approvers_with_asks() -> None:
    import asyncio

    from ringfence.network.session import MAX_OPEN_ASKS, EgressSession, Requester
    from ringfence.policy.egress import Verdict

    class Approver:  # a human who has not decided yet
        def __init__(self) -> None:
            self.asked: list[str] = []
            self.decide = asyncio.Event()
            self.all_open = asyncio.Event()

        async def ask(self, requester: Requester, host: str, port: int) -> bool:
            self.asked.append(host)
            if len(self.asked) == MAX_OPEN_ASKS:
                self.all_open.set()
            await self.decide.wait()
            return True

    approver = Approver()
    session = EgressSession(Requester("acme", "sandbox:s", asker=approver), NetworkPolicy())
    ask = Verdict(EgressAction.ASK, "ask")
    waiting = [
        asyncio.create_task(session.settle(ask, f"h{i}.review.test", 443))
        for i in range(MAX_OPEN_ASKS)
    ]
    await asyncio.wait_for(approver.all_open.wait(), 5)  # the first ones wait for a human
    flood = await asyncio.wait_for(session.settle(ask, "one-more.review.test", 443), 5)
    assert flood.action is EgressAction.DENY and "denied unasked" in flood.reason
    assert len(approver.asked) == MAX_OPEN_ASKS, "the approvers saw only the first ones"
    approver.decide.set()
    assert all(v.action is EgressAction.ALLOW for v in await asyncio.gather(*waiting))
    again = await session.settle(ask, "later.review.test", 443)  # room again once decided
    assert again.action is EgressAction.ALLOW
