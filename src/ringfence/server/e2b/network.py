"""E2B's network options on Ringfence's egress policy: ``allow_internet_access`` and
``network`` at create, ``PUT /sandboxes/{id}/network`` (``update_network``) later.

E2B's egress is open by default and its lists carve it; Ringfence's is closed by default and
its rules open it, deny winning (docs/network.md). The mapping (``egress_policy``, pure):

- **Internet access** is what the operator's default policy for the tenant allows
  (``RINGFENCE_NETWORK_DEFAULTS``): "all traffic" has no rule of its own here (``*`` and
  ``0.0.0.0/0`` are refused as too broad). Asked for outright (``allow_internet_access``
  true, or ``0.0.0.0/0`` in ``allowOut``) where the default allows nothing, it is refused
  (400), never turned into no network. Left implicit (no ``0.0.0.0/0`` in ``denyOut``, no
  ``allow_internet_access``), it is that default, whatever it is: a server whose operator
  gave the tenant no network gives none, as a sandbox created without options gets.
- ``allow_internet_access`` false, or ``0.0.0.0/0`` in ``denyOut``: nothing but ``allowOut``
  (E2B: allowed entries win over denied ones). The sandbox still gets the egress proxy, so a
  later ``update_network`` can open it.
- ``allowOut`` entries become allow rules on ports 80 and 443 (the ports E2B filters names
  on): an address or CIDR matches it as an IP literal; a name (``*.suffix`` too) reaches
  its public addresses or, where the operator's hosts table (``RINGFENCE_NETWORK_HOSTS``)
  points it into an internal network API clients may name
  (``RINGFENCE_NETWORK_INTERNAL_CIDRS``), that network (E2B cannot pair a name with a
  range). What a key may not open is refused naming the entry: an internal address the
  operator did not list, a range broader than /8, ``*.com``.
- ``denyOut`` entries (addresses and CIDRs, as E2B's) become deny rules, minus the
  ``allowOut`` ranges inside them (allowed wins), on every port something is allowed on.
- ``rules`` (``{host: [{"transform": {"headers": ...}}]}``) puts the headers on the rules
  ``allowOut`` made for that host: the proxy sets them, the API never returns them and the
  store never keeps them in clear. A host not in ``allowOut`` is refused: rules grant
  nothing, and here they need a rule to ride on.
- Under all of it the operator's floor stays: the default's deny and ask rules are added to
  every policy (``policy_for``), so no ``allowOut`` lifts them.

The work is bounded before it is done (the mapping runs on the event loop every tenant
shares): the lists are as long as a policy's rules at most, ``rules`` has at most as many
hosts; rules are kept once each by a hashable key; ``denyOut`` ranges inside another are
dropped (the outer one's pieces deny them), and each range is carved lazily, piece by piece,
so the request is refused the moment its rules would pass ``MAX_RULES`` (``_Rules``), never
after carving millions of pieces.

``dnsServers`` (non-empty) and ``egressProxy`` are refused: sandboxes resolve through
Ringfence's resolver and leave through its proxy only. ``allowPublicTraffic`` is the spec's
``public_traffic``.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import ipaddress
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, ParamSpec, TypeVar

from fastapi import APIRouter, Header, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ringfence.config import Config
from ringfence.errors import InvalidRequest, SandboxNotRunning
from ringfence.models import MAX_RULES, EgressAction, EgressRule, NetworkMode, NetworkPolicy
from ringfence.models.network import RuleKey
from ringfence.policy.network import beyond_ceiling, policy_for
from ringfence.server.e2b.context import caller, gone

__all__ = [
    "ALL_TRAFFIC",
    "NetworkOptions",
    "NetworkUpdate",
    "Wording",
    "create_fields",
    "egress_policy",
    "off_loop",
    "router",
]

router = APIRouter()

ALL_TRAFFIC = "0.0.0.0/0"  # E2B's "all traffic" (its SDKs' ALL_TRAFFIC)
E2B_PORTS = (80, 443)  # the ports E2B's egress filter decides names on
_MAX_PORTS = 64  # per rule (EgressRule.ports)
_MAX_HEADERS = 16  # per rule (EgressRule.headers)
_MAX_TRANSFORMS = 16  # per host of ``rules``: each sets headers, so 16 can set them all

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_P = ParamSpec("_P")
_T = TypeVar("_T")
# One thread maps every request's options (``off_loop``): a mapping at the bounds costs up to
# a few hundred milliseconds of validation, which the event loop then does not wait for,
# and many of them queue here rather than taking the default executor's workers (sandbox
# starts, checkpoints) or the loop.
_MAPPER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="e2b-network")


class Transform(BaseModel):
    """What E2B does to a request a host's rule matches: set headers. Another kind of
    transform (a newer SDK's) is refused, never dropped."""

    model_config = ConfigDict(extra="forbid")

    headers: dict[str, str] = Field(default_factory=dict, max_length=_MAX_HEADERS)


class TransformRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    transform: Transform | None = None


_Transforms = Annotated[list[TransformRule], Field(max_length=_MAX_TRANSFORMS)]


class _Egress(BaseModel):
    """The fields create's ``network`` and the update share (E2B's wire names)."""

    model_config = ConfigDict(extra="ignore")

    # Each entry of a list is a rule at least, and ``rules`` rides on them: none can be
    # longer than a policy (E2B documents no limits of its own).
    allowOut: list[str] | None = Field(None, max_length=MAX_RULES)
    denyOut: list[str] | None = Field(None, max_length=MAX_RULES)
    rules: dict[str, _Transforms] | None = Field(None, max_length=MAX_RULES)
    dnsServers: list[str] | None = Field(None, max_length=16)
    egressProxy: dict[str, Any] | None = None


class NetworkOptions(_Egress):
    """Create's ``network``."""

    allowPublicTraffic: bool | None = None
    maskRequestHost: str | None = None
    httpsPorts: list[int] | None = Field(None, max_length=_MAX_PORTS)


class NetworkUpdate(_Egress):
    """``PUT /sandboxes/{id}/network``: replaces the whole egress configuration (an omitted
    field is cleared, as E2B's). The Python SDK spells the switch ``allowInternetAccess``,
    the JavaScript SDK ``allow_internet_access``; both are read."""

    allowInternetAccess: bool | None = None
    allow_internet_access: bool | None = None

    def internet(self) -> bool | None:
        """The switch, however spelled.

        Raises:
            InvalidRequest: both spellings, saying different things.
        """
        camel, snake = self.allowInternetAccess, self.allow_internet_access
        if camel is not None and snake is not None and camel != snake:
            raise InvalidRequest("allowInternetAccess and allow_internet_access disagree")
        return camel if camel is not None else snake


@dataclass(frozen=True)
class Wording:
    """How the request being mapped names its fields, for the 400s that name them."""

    internet: str
    prefix: str  # "network." at create, "" in an update

    def field(self, name: str) -> str:
        return f"{self.prefix}{name}"


CREATE = Wording("allow_internet_access", "network.")
UPDATE = Wording("allowInternetAccess", "")


async def off_loop(work: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``work(*args, **kwargs)`` (a mapping of this module) on the module's own thread."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_MAPPER, functools.partial(work, *args, **kwargs))


def create_fields(
    internet: bool | None, raw: dict[str, Any] | None, tenant: str, config: Config
) -> dict[str, Any]:
    """The ``SandboxSpec`` fields of a create's ``allow_internet_access`` and ``network``:
    ``network`` (left out when neither says anything of egress: the tenant's default then
    applies, as to any sandbox created without a policy) and ``public_traffic``.

    Raises:
        InvalidRequest: something asked cannot be granted (named).
    """
    options = _options(raw or {})
    for name, given in (
        ("maskRequestHost", options.maskRequestHost is not None),
        ("httpsPorts", bool(options.httpsPorts)),
    ):
        if given:
            raise InvalidRequest(f"network.{name}: not supported by Ringfence's E2B door")
    fields: dict[str, Any] = {}
    if options.allowPublicTraffic:
        fields["public_traffic"] = True
    egress = {"allowOut", "denyOut", "rules", "dnsServers", "egressProxy"}
    if internet is not None or egress & options.model_fields_set:
        fields["network"] = egress_policy(internet, options, tenant, config, CREATE)
    return fields


def egress_policy(
    internet: bool | None, asked: _Egress, tenant: str, config: Config, wording: Wording
) -> NetworkPolicy:
    """The egress policy E2B's options ask for, for a sandbox of ``tenant`` (the module's
    docstring says how). The operator's floor is added later, by the service.

    Raises:
        InvalidRequest: an option or entry that cannot be granted, named.
    """
    _refuse_unmapped(asked, wording)
    allow_out = [entry.strip() for entry in asked.allowOut or []]
    deny_out = [entry.strip() for entry in asked.denyOut or []]
    all_allowed = ALL_TRAFFIC in allow_out
    if internet is True and ALL_TRAFFIC in deny_out:
        raise InvalidRequest(
            f"{wording.internet}: true contradicts {wording.field('denyOut')} {ALL_TRAFFIC}"
        )
    closed = not all_allowed and (internet is False or ALL_TRAFFIC in deny_out)
    default = policy_for(tenant, None, config)
    internet_rules = list(default.rules) if default.mode is NetworkMode.RULES else []
    if internet is True or all_allowed:
        _require_internet(internet_rules, tenant, wording, all_allowed)
    allows = _allow_rules(allow_out, config, wording)
    _add_headers(allows, asked.rules or {}, wording)
    rules = _Rules(wording)
    rules.extend([] if closed else internet_rules)
    rules.extend(allows.values())
    denied = _denied_networks(deny_out, wording)  # every entry checked, even when closed
    # Closed, or everything allowed: the deny list carves nothing.
    if not (closed or all_allowed):
        rules.extend(_deny_rules(denied, allow_out, rules.granted(), wording))
    return NetworkPolicy(mode=NetworkMode.RULES, rules=rules.kept())


class _Rules:
    """The policy's rules in order, each once (by ``EgressRule.key``), refused (400) the
    moment one more would pass ``MAX_RULES``: a caller that feeds it lazily stops there."""

    def __init__(self, wording: Wording) -> None:
        self._wording = wording
        self._rules: dict[RuleKey, EgressRule] = {}

    def extend(self, rules: Iterable[EgressRule]) -> None:
        for rule in rules:
            key = rule.key()
            if key in self._rules:
                continue
            if len(self._rules) == MAX_RULES:
                raise InvalidRequest(
                    f"{self._wording.prefix or 'network'}: more than {MAX_RULES} egress rules "
                    f"once mapped (at most {MAX_RULES}, the tenant's default and the denied "
                    "ranges' pieces included)"
                )
            self._rules[key] = rule

    def granted(self) -> list[EgressRule]:
        return [rule for rule in self._rules.values() if rule.action is not EgressAction.DENY]

    def kept(self) -> list[EgressRule]:
        return list(self._rules.values())


def _refuse_unmapped(asked: _Egress, wording: Wording) -> None:
    if asked.egressProxy is not None:
        raise InvalidRequest(
            f"{wording.field('egressProxy')}: sandboxes leave through Ringfence's own egress "
            "proxy only"
        )
    if asked.dnsServers:
        raise InvalidRequest(
            f"{wording.field('dnsServers')}: sandboxes resolve names through Ringfence's "
            "resolver only (it answers the names their policy allows); leave it out or []"
        )


def _require_internet(
    internet_rules: Sequence[EgressRule], tenant: str, wording: Wording, by_list: bool
) -> None:
    if any(rule.action is EgressAction.ALLOW for rule in internet_rules):
        return
    what = f"{wording.field('allowOut')} {ALL_TRAFFIC}" if by_list else f"{wording.internet}"
    raise InvalidRequest(
        f"{what}: this server defines no internet access for tenant {tenant!r}: Ringfence's "
        "egress is closed by default, and what internet access opens is the operator's "
        "default policy for the tenant (RINGFENCE_NETWORK_DEFAULTS), which allows nothing "
        f"here. List destinations in {wording.field('allowOut')} with "
        f"{wording.field('denyOut')} [{ALL_TRAFFIC}] instead"
    )


def _network(entry: str) -> Network | None:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None


def _allow_rules(
    allow_out: Sequence[str], config: Config, wording: Wording
) -> dict[str, EgressRule]:
    """The rule of each entry of ``allowOut`` but ``0.0.0.0/0``, by the entry as its rule
    holds it (a name as normalized, an address as its CIDR): entries that say the same
    thing make the same rule, kept once."""
    made: dict[str, EgressRule] = {}
    for index, entry in enumerate(allow_out):
        if entry == ALL_TRAFFIC:
            continue
        name = f"{wording.field('allowOut')}[{index}] ({entry!r})"
        network = _network(entry)
        if network is not None:
            rule = _rule(name, cidr=entry, ports=list(E2B_PORTS))
        else:
            rule = _rule(name, domain=entry, ports=list(E2B_PORTS))
            inside = _range_of(rule.domain or "", config)
            if inside is not None:
                rule = _rule(name, domain=rule.domain, cidr=inside, ports=list(E2B_PORTS))
        problem = beyond_ceiling(rule, config)
        if problem is not None:
            raise InvalidRequest(f"{name}: {problem}")
        made.setdefault((rule.cidr if network is not None else rule.domain) or "", rule)
    return made


def _range_of(domain: str, config: Config) -> str | None:
    """The internal network API clients may name (``network_internal_cidrs``) that the
    operator's hosts table points ``domain`` into, if it points it into one: E2B cannot
    pair a name with a range, so the operator's table does. Else None (public addresses)."""
    addresses = [ipaddress.ip_address(a) for a in config.network_hosts.get(domain, [])]
    for cidr in config.network_internal_cidrs:
        network = ipaddress.ip_network(cidr, strict=False)
        if addresses and all(a.version == network.version and a in network for a in addresses):
            return str(network)
    return None


def _add_headers(
    allows: dict[str, EgressRule], rules: dict[str, list[TransformRule]], wording: Wording
) -> None:
    """Put each host's transform headers on the rule its ``allowOut`` entry made."""
    for host, items in rules.items():
        name = f"{wording.field('rules')}[{host!r}]"
        headers: dict[str, str] = {}
        for item in items:
            if item.transform is not None:
                headers.update(item.transform.headers)
        if not headers:
            continue
        network = _network(host.strip())
        key = str(network) if network is not None else _rule(name, domain=host).domain
        rule = allows.get(key or "")
        if rule is None:
            raise InvalidRequest(
                f"{name}: {host} is not in {wording.field('allowOut')}; a rule's headers "
                "ride on the allow rule of its host (rules grant nothing by themselves)"
            )
        shape = rule.model_dump(mode="json")
        allows[key or ""] = _rule(name, **{**shape, "headers": headers})


def _denied_networks(deny_out: Sequence[str], wording: Wording) -> dict[str, Network]:
    """``denyOut``'s ranges by the name a refusal gives them, less ``0.0.0.0/0`` (it closes
    egress, handled by the caller) and less every range inside another one (the same range
    again included): the outer range's pieces deny all of it, so carving it again would only
    repeat work. Kept in the order given.

    Raises:
        InvalidRequest: an entry that is not an address or CIDR (named).
    """
    given: list[tuple[str, Network]] = []
    for index, entry in enumerate(deny_out):
        name = f"{wording.field('denyOut')}[{index}] ({entry!r})"
        network = _network(entry)
        if network is None:
            raise InvalidRequest(
                f"{name}: a deny list takes addresses and CIDRs, not names (as E2B's)"
            )
        if entry != ALL_TRAFFIC:
            given.append((name, network))
    outermost = set(_outermost([network for _, network in given]))
    return {name: network for i, (name, network) in enumerate(given) if i in outermost}


def _outermost(networks: Sequence[Network]) -> list[int]:
    """The indices of the networks not inside another one (of equal ones, the first's), in
    address order: CIDR blocks nest or are apart, so once sorted by start, broadest first,
    a block is inside another exactly when it ends no later than the furthest end so far."""
    kept: list[int] = []
    furthest: dict[int, int] = {}
    ordered = sorted(
        range(len(networks)),
        key=lambda i: (networks[i].version, int(networks[i].network_address),
                       networks[i].prefixlen, i),
    )  # fmt: skip
    for i in ordered:
        network = networks[i]
        end = int(network.broadcast_address)
        if end <= furthest.get(network.version, -1):
            continue
        furthest[network.version] = end
        kept.append(i)
    return kept


def _deny_rules(
    denied: dict[str, Network],
    allow_out: Sequence[str],
    granted: Iterable[EgressRule],
    wording: Wording,
) -> Iterator[EgressRule]:
    """Deny rules for the ``denied`` ranges, less the ``allowOut`` ranges within them, on
    every port something is granted on (a deny rule binds only its own ports). Made one by
    one: the caller stops taking them at its bound, and so stops the carving."""
    ports = sorted(
        {p for rule in granted if rule.action is not EgressAction.DENY for p in rule.ports}
    )
    if not ports:
        return
    allowed = [n for n in map(_network, allow_out) if n is not None]
    holes = [allowed[i] for i in _outermost(allowed)]
    for name, network in denied.items():
        for piece in _carve(network, holes):
            for start in range(0, len(ports), _MAX_PORTS):
                chunk = ports[start : start + _MAX_PORTS]
                yield _rule(name, action="deny", cidr=str(piece), ports=chunk)


def _carve(network: Network, holes: Sequence[Network]) -> Iterator[Network]:
    """``network`` less every hole of its version (E2B: an allowed range wins over a denied
    one it lies in) as the fewest CIDR blocks (those whose parent block meets a hole), in
    address order, one at a time. ``holes`` must not nest (``_outermost``).

    The work is bounded by what is taken: the blocks visited are a binary tree whose leaves
    are the blocks yielded and at most one block per hole (lying in it), so taking k blocks
    costs O((k + holes) log holes), whatever the ranges."""
    spans = [
        (int(hole.network_address), int(hole.broadcast_address))
        for hole in holes
        if hole.version == network.version
    ]  # sorted by start, apart: their ends are sorted too
    starts = [first for first, _ in spans]
    bits = network.max_prefixlen
    block = type(network)
    pending = [(int(network.network_address), network.prefixlen)]
    while pending:
        first, prefix = pending.pop()
        last = first + (1 << (bits - prefix)) - 1
        # The last hole that starts within reach: the only one that can hold this block, and
        # the one reaching furthest of those that start before the block ends.
        i = bisect.bisect_right(starts, last) - 1
        if i < 0 or spans[i][1] < first:
            yield block((first, prefix))  # meets no hole
            continue
        if spans[i][0] <= first and last <= spans[i][1]:  # lies in that hole
            continue
        half = 1 << (bits - prefix - 1)
        pending.append((first + half, prefix + 1))
        pending.append((first, prefix + 1))  # the lower half first


def _rule(name: str, **shape: Any) -> EgressRule:
    try:
        return EgressRule.model_validate(shape)
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise InvalidRequest(f"{name}: {problems}") from None


def _options(raw: dict[str, Any]) -> NetworkOptions:
    try:
        return NetworkOptions.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"network.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequest(problems) from None


SandboxId = Annotated[str, Path(max_length=64)]
ApiKey = Annotated[str | None, Header(alias="X-API-KEY")]


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
async def update_network(
    sandbox_id: SandboxId, body: NetworkUpdate, request: Request, x_api_key: ApiKey = None
) -> Response:
    """Replace a running sandbox's egress policy (connections from now on), mapped as at
    create; 204. A sandbox created without network (no options, and no default for its
    tenant) has no proxy to change: 400.

    The sandbox is looked up before the options are mapped: a key that names a sandbox it
    cannot see gets its 404 without making the server map anything."""
    context, principal = await caller(request, x_api_key)
    sandbox = await context.sandboxes.get(principal.tenant, sandbox_id)
    if sandbox.state.is_terminal:
        raise gone(sandbox_id)
    policy = await off_loop(
        egress_policy, body.internet(), body, principal.tenant, context.sandboxes.config, UPDATE
    )
    try:
        await context.sandboxes.set_network(
            principal.tenant, sandbox_id, policy, actor=principal.key_id
        )
    except SandboxNotRunning:
        raise gone(sandbox_id) from None
    return Response(status_code=204)
