"""Network egress policy: where a sandbox may connect (docs/network.md). Deny wins."""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

__all__ = [
    "MAX_RULES",
    "REDACTED",
    "EgressAction",
    "EgressRule",
    "NetworkMode",
    "NetworkPolicy",
    "RuleKey",
]

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
# The names _valid_domain accepts, for the JSON schema (checked by the validator, which also
# lowercases and strips a final dot).
_SCHEMA_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CIDR_SCHEMA = (  # IPv4 exactly (at most /8 broad); IPv6 by its alphabet (the validator decides)
    rf"^({_OCTET}(\.{_OCTET}){{3}}(/([89]|[12][0-9]|3[0-2]))?"
    r"|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(/[0-9]{1,3})?)$"
)
_DOMAIN_SCHEMA = (
    rf"^(\*\.{_SCHEMA_LABEL}(\.{_SCHEMA_LABEL})+|{_SCHEMA_LABEL}(\.{_SCHEMA_LABEL})*)\.?$"
)
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
# Headers the proxy owns: a rule may not set them.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "proxy-authorization",
     "proxy-connection", "keep-alive", "te", "trailer", "upgrade"}
)  # fmt: skip
_MIN_PREFIX = {4: 8, 6: 32}  # broader CIDRs are refused as too broad
_IPV4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")  # IPv4 addresses written as IPv6
REDACTED = "<redacted>"
MAX_RULES = 256  # rules per policy


class EgressAction(StrEnum):
    """What a matching rule decides. The strings are API."""

    ALLOW = "allow"
    DENY = "deny"  # wins over every other rule that matches
    ASK = "ask"  # a human decides at the first connection; remembered for the sandbox's life


# EgressRule.key(): action, domain, cidr, ports, headers (sorted).
RuleKey = tuple[EgressAction, str | None, str | None, tuple[int, ...], tuple[tuple[str, str], ...]]


# What ``EgressRule._consistent`` checks, stated in its JSON schema: a domain or a cidr;
# headers on allow rules only.
_RULE_SCHEMA: JsonDict = {
    "anyOf": [
        {"required": [field], "properties": {field: {"type": "string"}}}
        for field in ("domain", "cidr")
    ],
    "if": {"required": ["action"], "properties": {"action": {"enum": ["deny", "ask"]}}},
    "then": {"properties": {"headers": {"maxProperties": 0}}},
}


class EgressRule(BaseModel):
    """One rule of an egress policy: which destinations it matches, and what it decides."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_RULE_SCHEMA)

    action: EgressAction = Field(EgressAction.ALLOW, description="allow, deny or ask.")
    domain: str | None = Field(
        None,
        max_length=253,
        description="A host name ('pypi.org', matching only itself) or '*.suffix' (matching "
        "every name below the suffix, not the suffix itself). '*' and '*.tld' are refused.",
        json_schema_extra={"pattern": _DOMAIN_SCHEMA},
    )
    cidr: str | None = Field(
        None,
        description="Addresses the destination must resolve into (with a domain), or IP "
        "literals the rule matches (alone). Needed to reach loopback or private addresses. "
        "At most /8 (IPv4) or /32 (IPv6) broad; an IPv4-mapped range (::ffff:a.b.c.d/n) "
        "is stored as the IPv4 range it names. Loopback and private ranges only where the "
        "operator allows them (RINGFENCE_NETWORK_INTERNAL_CIDRS).",
        json_schema_extra={"pattern": _CIDR_SCHEMA},
    )
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=lambda: [80, 443],
        min_length=1,
        max_length=64,
        description="Destination ports the rule matches.",
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="allow rules only: headers the proxy adds to plain-HTTP requests it lets "
        "through (a credential the sandbox never sees). Never returned by the API.",
    )

    @field_validator("domain")
    @classmethod
    def _valid_domain(cls, domain: str | None) -> str | None:
        if domain is None:
            return None
        name = domain.strip().lower().removesuffix(".")
        wildcard = name.startswith("*.")
        labels = (name[2:] if wildcard else name).split(".")
        if name == "*" or (wildcard and len(labels) < 2):
            raise ValueError(f"domain {domain!r} is too broad (name at least 'example.com')")
        if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
            raise ValueError(f"invalid domain {domain!r} (ASCII names; '*.' only as a prefix)")
        return name

    @field_validator("cidr")
    @classmethod
    def _valid_cidr(cls, cidr: str | None) -> str | None:
        if cidr is None:
            return None
        try:
            network = ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError:
            raise ValueError(f"invalid cidr {cidr!r}") from None
        if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_IPV4_MAPPED):
            # ::ffff:a.b.c.d is a.b.c.d on the wire: decided, checked and stored as IPv4.
            network = ipaddress.IPv4Network(
                (int(network.network_address) & 0xFFFFFFFF, network.prefixlen - 96)
            )
        if network.prefixlen < _MIN_PREFIX[network.version]:
            raise ValueError(f"cidr {cidr!r} is too broad")
        return str(network)

    @field_validator("ports")
    @classmethod
    def _valid_ports(cls, ports: list[int]) -> list[int]:
        return sorted(set(ports))

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        if len(headers) > 16:
            raise ValueError("at most 16 headers per rule")
        for name, value in headers.items():
            if not _HEADER_NAME.match(name) or name.lower() in _RESERVED_HEADERS:
                raise ValueError(f"header {name!r} cannot be set by a rule")
            if any(c in value for c in "\r\n\0") or len(value) > 8192:
                raise ValueError(f"header {name}: no CR, LF or NUL, at most 8192 characters")
        return headers

    @model_validator(mode="after")
    def _consistent(self) -> EgressRule:
        if self.domain is None and self.cidr is None:
            raise ValueError("a rule needs a domain, a cidr, or both")
        if self.headers and self.action is not EgressAction.ALLOW:
            raise ValueError("only allow rules can add headers")
        return self

    def key(self) -> RuleKey:
        """The rule as a hashable value: equal rules have equal keys, and only they. Sets of
        keys find a rule among many in constant time, where ``rule in rules`` compares
        every pydantic model in turn (quadratic over lists of rules)."""
        headers = tuple(sorted(self.headers.items()))
        return (self.action, self.domain, self.cidr, tuple(self.ports), headers)


class NetworkMode(StrEnum):
    NONE = "none"  # loopback only: no proxy, no resolver (the default)
    RULES = "rules"  # the proxy and the resolver, deciding by ``rules``


class NetworkPolicy(BaseModel):
    """Where a sandbox may connect. Deny wins; an empty rule list allows nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: NetworkMode = Field(
        NetworkMode.NONE,
        description="none: loopback only. rules: through Ringfence's proxy, by the rules "
        "(given rules imply it).",
    )
    rules: list[EgressRule] = Field(
        default_factory=list, max_length=MAX_RULES, description="Checked all together; deny wins."
    )

    @model_validator(mode="before")
    @classmethod
    def _rules_imply_mode(cls, data: object) -> object:
        if isinstance(data, dict) and "mode" not in data and data.get("rules"):
            return {**data, "mode": NetworkMode.RULES}
        return data

    @model_validator(mode="after")
    def _no_rules_without_mode(self) -> NetworkPolicy:
        if self.mode is NetworkMode.NONE and self.rules:
            raise ValueError("mode none takes no rules")
        return self

    def redacted(self) -> NetworkPolicy:
        """This policy with every header value hidden (what the API shows and stores)."""
        rules = [
            rule.model_copy(update={"headers": dict.fromkeys(rule.headers, REDACTED)})
            for rule in self.rules
        ]
        return self.model_copy(update={"rules": rules})
