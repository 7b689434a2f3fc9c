"""E2B's network options mapped onto Ringfence's egress policy (``server.e2b.network``), as
pure functions: what each option asks for becomes which rules, and what cannot be granted
is refused naming it. The live behaviour is ``tests/e2b/test_network.py``'s."""

from __future__ import annotations

from typing import Any

import pytest

from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import EgressAction, EgressRule, NetworkMode, NetworkPolicy
from ringfence.policy.egress import decide
from ringfence.policy.network import check_tenant_policy, policy_for
from ringfence.server.e2b.network import (
    CREATE,
    UPDATE,
    NetworkOptions,
    NetworkUpdate,
    create_fields,
    egress_policy,
)

ALL = "0.0.0.0/0"
OPERATOR = NetworkPolicy.model_validate(
    {"rules": [
        {"domain": "pypi.org", "ports": [443]},
        {"domain": "mirror.internal", "cidr": "10.20.0.0/16", "ports": [8080]},
        {"domain": "secrets.example.com", "action": "deny"},
        {"domain": "payments.example.com", "action": "ask"},
    ]}
)  # fmt: skip
CONFIG = Config(network_defaults={"acme": OPERATOR}, pool_sizes={})


def create(internet: bool | None = None, config: Config = CONFIG, **network: Any) -> Any:
    return create_fields(internet, network or None, "acme", config).get("network")


def update(config: Config = CONFIG, tenant: str = "acme", **body: Any) -> NetworkPolicy:
    asked = NetworkUpdate.model_validate(body)
    return egress_policy(asked.internet(), asked, tenant, config, UPDATE)


def effective(policy: NetworkPolicy, tenant: str = "acme") -> NetworkPolicy:
    """What the service makes of it: checked as an API client's, under the floor."""
    check_tenant_policy(policy, CONFIG, tenant)
    return policy_for(tenant, policy, CONFIG)


def verdict(policy: NetworkPolicy, host: str, port: int = 443) -> EgressAction:
    return decide(policy, host, port).action


def refused(match: str, call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InvalidRequest, match=match) as caught:
        call(*args, **kwargs)
    return caught.value.message


def test_no_options_leave_the_tenants_default_in_place() -> None:
    assert create() is None
    assert create_fields(None, {"allowPublicTraffic": False}, "acme", CONFIG) == {}


def test_internet_access_is_the_operators_default_and_refused_where_there_is_none() -> None:
    internet = create(True)
    assert internet.rules == OPERATOR.rules
    assert update(allowInternetAccess=True).rules == OPERATOR.rules
    assert update(allowOut=[ALL], denyOut=[ALL]).rules == OPERATOR.rules, "allowed wins"
    for call in (
        lambda: create(True, Config(pool_sizes={})),
        lambda: update(tenant="globex", allowInternetAccess=True),
    ):
        message = refused("allow_?[iI]nternet_?[aA]ccess: this server defines no internet", call)
        assert "RINGFENCE_NETWORK_DEFAULTS" in message
    refused(r"allowOut 0\.0\.0\.0/0: this server defines no internet", update, tenant="globex",
            allowOut=[ALL])  # fmt: skip


def test_implicit_internet_is_the_default_whatever_it_is() -> None:
    """E2B's egress is open unless denied: here that is the tenant's default, and an update
    that omits everything puts it back (E2B: omitted fields are cleared)."""
    assert update().rules == OPERATOR.rules
    assert update(tenant="globex") == NetworkPolicy(mode=NetworkMode.RULES, rules=[])
    extra = update(allowOut=["api.example.com"])
    assert verdict(extra, "pypi.org") is EgressAction.ALLOW
    assert verdict(extra, "api.example.com") is EgressAction.ALLOW


def test_closed_egress_opens_only_allow_out_under_the_operators_floor() -> None:
    for closed in (create(False), update(allowInternetAccess=False), update(denyOut=[ALL])):
        assert closed.mode is NetworkMode.RULES and closed.rules == []
        floor = effective(closed)
        assert verdict(floor, "pypi.org") is EgressAction.DENY
        assert verdict(floor, "secrets.example.com") is EgressAction.DENY
    only = effective(update(allowOut=["api.example.com", "*.github.com"], denyOut=[ALL]))
    assert verdict(only, "api.example.com") is EgressAction.ALLOW
    assert verdict(only, "api.example.com", 80) is EgressAction.ALLOW
    assert verdict(only, "api.example.com", 22) is EgressAction.DENY, "E2B's name ports only"
    assert verdict(only, "codeload.github.com") is EgressAction.ALLOW
    assert verdict(only, "pypi.org") is EgressAction.DENY


def test_the_operators_deny_and_ask_rules_outlive_any_allow_out() -> None:
    lifted = effective(update(allowOut=["secrets.example.com", "payments.example.com"]))
    assert verdict(lifted, "secrets.example.com") is EgressAction.DENY
    assert verdict(lifted, "payments.example.com") is EgressAction.ASK


def test_addresses_match_as_literals_and_allowed_ranges_win_over_denied_ones() -> None:
    policy = update(allowOut=["1.1.1.1", "8.8.8.8"], denyOut=["8.8.8.0/24", "9.9.9.9"])
    assert verdict(policy, "1.1.1.1") is EgressAction.ALLOW
    assert verdict(policy, "8.8.8.8") is EgressAction.ALLOW, "inside a denied range, allowed"
    assert verdict(policy, "8.8.8.9") is EgressAction.DENY
    assert verdict(policy, "9.9.9.9", 8080) is EgressAction.DENY, "denied on every granted port"
    denies = [r for r in policy.rules if r.action is EgressAction.DENY and r.cidr]
    assert "8.8.8.8/32" not in {r.cidr for r in denies}
    assert all(r.ports == [80, 443, 8080] for r in denies)
    assert update(allowOut=["8.8.8.0/24"], denyOut=["8.8.8.8"]).rules[-1].cidr == "8.8.8.0/24"


def test_names_reach_the_internal_network_the_operators_hosts_table_points_them_into() -> None:
    config = Config(
        network_internal_cidrs=["10.20.0.0/16"],
        network_hosts={"mirror.corp": ["10.20.0.5"], "db.corp": ["10.30.0.5"]},
        pool_sizes={},
    )
    rules = update(config, allowOut=["mirror.corp", "db.corp", "pypi.org"], denyOut=[ALL]).rules
    assert rules == [
        EgressRule(domain="mirror.corp", cidr="10.20.0.0/16", ports=[80, 443]),
        EgressRule(domain="db.corp", ports=[80, 443]),  # not a network clients may name
        EgressRule(domain="pypi.org", ports=[80, 443]),
    ]


def test_grants_beyond_the_ceiling_are_refused_naming_the_entry() -> None:
    for entry, why in (
        ("169.254.169.254", "an internal network"),
        ("10.0.0.0/8", "an internal network"),
        ("0.0.0.0/1", "too broad"),
        ("*.com", "too broad"),
        ("bad_name!", "invalid domain"),
    ):
        message = refused(r"allowOut\[1\]", update, allowOut=["ok.example", entry])
        assert entry in message and why in message
    assert "network.allowOut[0]" in refused("internal", create, allowOut=["127.0.0.1"])


def test_what_has_no_mapping_is_refused_not_dropped() -> None:
    refused(r"denyOut\[0\].*not names", update, denyOut=["evil.example"])
    refused(r"denyOut\[0\].*not names", update, denyOut=["evil.example", ALL])
    refused("egressProxy", update, egressProxy={"address": "proxy.example:1080"})
    refused("dnsServers", update, dnsServers=["1.1.1.1"])
    assert update(dnsServers=[]).rules == OPERATOR.rules, "no DNS server: nothing to grant"
    refused("contradicts", create, True, denyOut=[ALL])
    refused("maskRequestHost", create, maskRequestHost="${PORT}-x.example")
    refused("httpsPorts", create, httpsPorts=[3000])
    refused("network.rules", create, rules={"a.example": [{"transform": {"body": "x"}}]})
    public = create_fields(None, {"allowPublicTraffic": True}, "acme", CONFIG)
    assert public == {"public_traffic": True}


def test_header_transforms_ride_on_the_allow_rules_of_their_host() -> None:
    secret = "Bearer s3cret"
    policy = update(
        allowOut=["API.example.com", "1.1.1.1"],
        denyOut=[ALL],
        rules={
            "api.example.com": [
                {"transform": {"headers": {"Authorization": "old", "X-A": "1"}}},
                {"transform": {"headers": {"Authorization": secret}}},
            ],
            "1.1.1.1": [{"transform": {"headers": {"X-B": "2"}}}],
            "quiet.example": [{}],  # no transform: nothing to carry
        },
    )
    by_target = {r.domain or r.cidr: r.headers for r in policy.rules}
    assert by_target == {
        "api.example.com": {"Authorization": secret, "X-A": "1"},
        "1.1.1.1/32": {"X-B": "2"},
    }
    assert secret not in policy.redacted().model_dump_json()
    refused(r"rules\['other.example'\].*not in allowOut", update, allowOut=["a.example"],
            rules={"other.example": [{"transform": {"headers": {"X": "1"}}}]})  # fmt: skip
    refused(r"rules\['a.example'\].*cannot be set", update, allowOut=["a.example"],
            rules={"a.example": [{"transform": {"headers": {"Host": "b.example"}}}]})  # fmt: skip


def test_the_operators_own_rules_pass_the_tenant_check_only_for_their_tenant() -> None:
    """Internet access hands the default's rules back, internal ones included: they are the
    operator's, so the tenant check lets them by for that tenant (and for no other)."""
    internet = update(allowInternetAccess=True)
    check_tenant_policy(internet, CONFIG, "acme")
    refused("internal network", check_tenant_policy, internet, CONFIG, "globex")
    refused("internal network", check_tenant_policy, internet, CONFIG)


def test_too_many_rules_once_mapped_is_a_400() -> None:
    allow = [f"h{i}.example" for i in range(200)]
    deny = [f"9.9.{i}.0/24" for i in range(100)]
    refused("at most 256", update, allowOut=allow, denyOut=deny)


def test_create_options_parse_errors_name_the_field() -> None:
    refused(r"network\.allowOut", create_fields, None, {"allowOut": "x"}, "acme", CONFIG)
    assert isinstance(NetworkOptions.model_validate({"futureOption": 1}), NetworkOptions)
    assert create(denyOut=["9.9.9.9"]).rules[-1] == EgressRule(
        action="deny", cidr="9.9.9.9/32", ports=[80, 443, 8080]
    )
    assert CREATE.field("allowOut") == "network.allowOut"


def test_the_update_reads_the_switch_as_either_sdk_spells_it() -> None:
    assert update(allow_internet_access=False).rules == [], "the JavaScript SDK's"
    assert update(allowInternetAccess=False).rules == [], "the Python SDK's"
    assert update(allowInternetAccess=True, allow_internet_access=True).rules == OPERATOR.rules
    refused("disagree", update, allowInternetAccess=True, allow_internet_access=False)


# Shapes of E2B network options at the sizes the models allow, each built to make the mapping
# work hard: holes that split denied ranges into many pieces (each address carved out of a
# /32 leaves ~80), many denied ranges sharing those holes, and many header rules naming the
# same host in different spellings. Each must be mapped or refused within a moment: the
# mapping runs on the event loop that serves every tenant.


def _spelling(number: int, name: str) -> str:
    """The ``number``th of the ways to write ``name`` in upper and lower case."""
    return "".join(c.upper() if number >> i & 1 else c for i, c in enumerate(name))


_SPREAD = [f"2001:4860:{i:x}::1" for i in range(1, 257)]  # public, across one /32
_COVER = [f"2001:4860:{i:x}00::/40" for i in range(256)]  # 256 /40s: that whole /32
WORST_SHAPES: dict[str, dict[str, Any]] = {
    "spread holes in one denied /32 (the review's)": {
        "allowOut": _SPREAD[:128], "denyOut": ["2001:4860::/32"]},
    "256 spread holes, 256 copies of the /32": {
        "allowOut": _SPREAD, "denyOut": ["2001:4860::/32"] * 256},
    "256 spread holes, 256 distinct denied ranges around them": {
        "allowOut": _SPREAD, "denyOut": [f"2001:4860::{i:x}/{32 + i % 9}" for i in range(256)]},
    "256 holes covering the /32, every broader range denied": {
        "allowOut": _COVER, "denyOut": [f"2000::/{p}" for p in range(3, 33)] * 8},
    "the same host in 256 spellings, each with 16 headers": {
        "allowOut": ["api.example.com"] * 256,
        "rules": {_spelling(i, "api.example.com"): [
            {"transform": {"headers": {f"X-{j}": "v" for j in range(16)}}}] * 16
            for i in range(256)}},
}  # fmt: skip
_MAP_EACH = """
import json, sys, time
from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.server.e2b.network import UPDATE, NetworkUpdate, egress_policy
for name, body in json.load(sys.stdin).items():
    started = time.monotonic()
    try:
        asked = NetworkUpdate.model_validate(body)
        egress_policy(None, asked, "acme", Config(pool_sizes={}), UPDATE)
        outcome = "mapped"
    except (InvalidRequest, ValueError) as exc:
        outcome = f"refused: {str(exc)[:200]}"
    print(json.dumps([name, time.monotonic() - started, outcome]), flush=True)
"""


def test_no_network_options_make_the_mapping_work_for_more_than_a_moment() -> None:
    """In a child process under a deadline, so a mapping that would take days fails this
    test instead of hanging the suite."""
    import json
    import os
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", _MAP_EACH], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    try:
        out, _ = child.communicate(json.dumps(WORST_SHAPES), timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
    done = {
        name: (seconds, outcome) for name, seconds, outcome in map(json.loads, out.splitlines())
    }
    assert list(done) == list(WORST_SHAPES), f"still mapping after 60 s; done: {done}"
    slow = {name: took for name, took in done.items() if took[0] > 2.0}
    assert not slow, slow
    mapped = {name for name, (_, outcome) in done.items() if outcome == "mapped"}
    assert mapped == {"the same host in 256 spellings, each with 16 headers"}, done
    assert "at most 256" in done["256 spread holes, 256 copies of the /32"][1]


def test_denied_ranges_are_carved_exactly_into_the_fewest_pieces() -> None:
    """Against the addresses themselves: every address of the denied /24 is allowed when an
    allowed range holds it and denied otherwise, and the deny rules are the fewest CIDRs
    that cover the rest (what ``collapse_addresses`` makes of it)."""
    import ipaddress
    import random

    chooser = random.Random(14)
    denied = ipaddress.IPv4Network("8.8.8.0/24")
    for _ in range(12):
        holes = [
            ipaddress.IPv4Network((int(denied.network_address) + chooser.randrange(256), size),
                                  strict=False)
            for size in chooser.choices([32, 30, 28, 26], k=chooser.randrange(1, 12))
        ]  # fmt: skip
        policy = update(allowOut=[str(h) for h in holes], denyOut=[str(denied)])
        for address in denied:
            expected = EgressAction.ALLOW if any(address in h for h in holes) else EgressAction.DENY
            assert verdict(policy, str(address)) is expected, (holes, address)
        rest = [a for a in denied if not any(a in h for h in holes)]
        fewest = {str(n) for n in ipaddress.collapse_addresses(rest)}
        pieces = {r.cidr for r in policy.rules if r.action is EgressAction.DENY and r.cidr}
        assert pieces == fewest, holes


def test_a_denied_range_inside_another_adds_no_rules_and_denies_as_before() -> None:
    nested = update(allowOut=["8.8.8.8"], denyOut=["8.8.0.0/16", "8.8.8.0/24", "8.8.0.0/16"])
    alone = update(allowOut=["8.8.8.8"], denyOut=["8.8.0.0/16"])
    assert nested.rules == alone.rules
    assert verdict(nested, "8.8.8.8") is EgressAction.ALLOW
    assert verdict(nested, "8.8.8.9") is EgressAction.DENY
    assert verdict(nested, "8.8.9.1") is EgressAction.DENY
    refused(r"denyOut\[2\].*not names", update, denyOut=["8.8.0.0/16", "8.8.8.0/24", "x.example"])


def test_a_rules_key_tells_rules_apart_exactly_as_equality_does() -> None:
    rules = [
        EgressRule(domain="a.example"),
        EgressRule(domain="a.example", ports=[443, 80]),  # the same: ports are sorted
        EgressRule(domain="a.example", action="deny"),
        EgressRule(domain="a.example", headers={"X-A": "1", "X-B": "2"}),
        EgressRule(domain="a.example", headers={"X-B": "2", "X-A": "1"}),
        EgressRule(cidr="1.1.1.1"),
        EgressRule(domain="a.example", cidr="1.1.1.1/32"),
    ]
    for one in rules:
        for other in rules:
            assert (one.key() == other.key()) is (one == other), (one, other)
