"""The operator's risk policy: Cedar policies that raise a proposal's risk or forbid it.

The proposer names a risk; the operator's policy (``RINGFENCE_RISK_POLICY``, a ``.cedar``
file) has the last word, evaluated here by Cedar (``cedarpy``: AWS's policy language and
engine, not a rule language of ours). Each proposal is asked two questions, in one batch:

- ``Ringfence::Action::"propose"``: may it be proposed at all? Ringfence adds one rule
  permitting every proposal; any ``forbid`` of the operator's that matches wins (Cedar:
  forbid overrides permit), and the proposal is refused, naming the rule.
- ``Ringfence::Action::"high_risk"``: is it high risk? Any ``permit`` that matches makes
  it so, naming the rule; nothing matching leaves the proposer's risk.

The final risk is the higher of the proposer's and the operator's: a proposer may raise it,
never lower it below the policy's.

The principal is the proposing key, ``Ringfence::Key::"<key id>"`` (attribute ``role``),
a member of its tenant ``Ringfence::Tenant::"<tenant>"``, which is also the resource. The
context describes what would run as it would run on this server (``policy.placement``: the
backend's image and namespace, the egress policy in force); ``SCHEMA`` lists it. Policies are
checked against ``SCHEMA`` when loaded, so a misspelt attribute refuses to start the
server; every policy needs an ``@id("...")`` annotation, which answers and the console show.

Failing closed: an evaluation that errors (Cedar skips a policy whose condition errors,
which for a ``forbid`` would let the proposal through) refuses the proposal rather than
treating it as high risk: a forbid rule that errored may be the one that should have
refused it, and two approvers are no substitute for the operator's "never".
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cedarpy

from ringfence.errors import InvalidRequest
from ringfence.models import EgressAction, ExecutionRequest, NetworkMode, Risk, RiskSource
from ringfence.policy.placement import Placement

__all__ = ["SCHEMA", "Assessment", "RiskPolicy", "assess", "load_risk_policy"]

SCHEMA = """
namespace Ringfence {
  entity Tenant;
  entity Key in [Tenant] { role: String };
  action propose, high_risk appliesTo {
    principal: Key,
    resource: Tenant,
    context: {
      argv: Set<String>,          // every word of the command
      program: String,            // its first word, as given ("/usr/bin/kubectl")
      program_name: String,       // the first word's last path part ("kubectl")
      command_line: String,       // the command as one shell-quoted line, for `like`
      env: Set<String>,           // names of the environment variables it sets
      image: String,              // the root filesystem or container image (default filled in)
      namespace: String,          // the sandbox namespace on Kubernetes, "" on other backends
      backend: String,            // the server's backend: "local", "job", "process"
      target_namespace: String,   // the namespace it acts on, "" for none
      remediation_action: String, // "" for none
      network: Bool,              // it may reach anything beyond loopback
      hosts: Set<String>,         // domains of its allow and ask rules
      cidrs: Set<String>,         // address ranges of its allow and ask rules
      credentials: Bool,          // a rule injects headers (a brokered credential)
      mounts: Set<String>,        // host paths granted to it
      writable_mounts: Bool,      // one of them is read-write
      proposed_risk: String       // what the proposer said: "low" or "high"
    }
  };
}
"""

_DEFAULT_ID = "ringfence:may-propose"
# Without it Cedar denies everything; with it, only the operator's forbid rules refuse.
_DEFAULT = f"""
@id("{_DEFAULT_ID}")
permit (principal, action == Ringfence::Action::"propose", resource);
"""
_SCHEMA = cedarpy.Schema.from_str(SCHEMA)
_ACTIONS = ("propose", "high_risk")


@dataclass(frozen=True)
class RiskPolicy:
    """A loaded, validated policy set: ``path`` for messages, ``order`` the rule ids in file
    order (answers name rules in that order)."""

    path: str
    policies: cedarpy.PolicySet
    order: tuple[str, ...]


@dataclass(frozen=True)
class Assessment:
    """What the policy made of a proposal."""

    risk: Risk  # the higher of the proposer's and the policy's
    source: RiskSource  # who set ``risk``
    rules: tuple[str, ...] = ()  # the operator's rules that set it (source policy)
    refusal: str | None = None  # set: the proposal is refused, and this says why


def load_risk_policy(path: Path | None) -> RiskPolicy | None:
    """Read and validate the operator's policy file (None: no policy).

    Raises:
        InvalidRequest: unreadable, not Cedar, not valid against ``SCHEMA``, or a policy
            without a unique ``@id``; the message is one line naming the file.
    """
    if path is None:
        return None
    where = f"RINGFENCE_RISK_POLICY {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{where}: cannot read it: {exc}") from None
    try:
        as_json = json.loads(cedarpy.policies_to_json_str(text))
        result = cedarpy.validate_policies(text, _SCHEMA)
    except ValueError as exc:
        raise InvalidRequest(f"{where}: not a Cedar policy set: {_one_line(exc)}") from None
    parsed: dict[str, dict[str, Any]] = as_json["staticPolicies"]
    if as_json["templates"]:
        raise InvalidRequest(f"{where}: policy templates are not supported (write policies)")
    if not parsed:
        raise InvalidRequest(f"{where}: it holds no policy")
    if not result.validation_passed:
        first = result.errors[0]
        raise InvalidRequest(f"{where}: {_one_line(first.error)}")
    ids: list[str] = []
    in_file_order = sorted(parsed.items(), key=lambda item: int(item[0].removeprefix("policy")))
    for index, (_, policy) in enumerate(in_file_order, start=1):
        rule = policy.get("annotations", {}).get("id")
        if not rule:
            raise InvalidRequest(f'{where}: policy {index} has no @id("...") annotation')
        if rule in ids or rule == _DEFAULT_ID:
            raise InvalidRequest(f"{where}: two policies share the @id {rule!r}")
        ids.append(rule)
    policies = cedarpy.PolicySet.from_str(text + _DEFAULT)
    return RiskPolicy(str(path), policies, tuple(ids))


def assess(
    policy: RiskPolicy | None,
    request: ExecutionRequest,
    *,
    tenant: str,
    requester: str,
    role: str,
    proposed: Risk,
    where: Placement,
) -> Assessment:
    """The risk ``request``, proposed by key ``requester`` (``role``) of ``tenant`` as
    ``proposed`` and to run ``where``, gets under ``policy``, or why it is refused. Pure
    apart from Cedar."""
    if policy is None:
        return Assessment(proposed, RiskSource.PROPOSER)
    principal = {"type": "Ringfence::Key", "id": requester}
    entities: list[dict[str, object]] = [
        {"uid": principal, "attrs": {"role": role},
         "parents": [{"type": "Ringfence::Tenant", "id": tenant}]},
        {"uid": {"type": "Ringfence::Tenant", "id": tenant}, "attrs": {}, "parents": []},
    ]  # fmt: skip
    context = _context(request, proposed, where)
    questions = [
        {
            "principal": principal,
            "action": {"type": "Ringfence::Action", "id": action},
            "resource": {"type": "Ringfence::Tenant", "id": tenant},
            "context": context,
        }
        for action in _ACTIONS
    ]
    try:
        may, high = cedarpy.is_authorized_batch(questions, policy.policies, entities, _SCHEMA)
    except (ValueError, TypeError, RuntimeError) as exc:  # a request Cedar would not take
        return _failed(_one_line(exc), proposed)
    for answer in (may, high):
        errors = answer.diagnostics.errors
        if errors or answer.decision not in (cedarpy.Decision.Allow, cedarpy.Decision.Deny):
            return _failed(_one_line(errors[0] if errors else "no decision"), proposed)
    if may.decision is not cedarpy.Decision.Allow:
        forbidding = _rules(policy, may)
        return Assessment(
            proposed,
            RiskSource.POLICY,
            forbidding,
            f"forbidden by the operator's risk policy (rule {', '.join(forbidding) or '?'})",
        )
    if high.decision is cedarpy.Decision.Allow:
        return Assessment(Risk.HIGH, RiskSource.POLICY, _rules(policy, high))
    return Assessment(proposed, RiskSource.PROPOSER)


def _context(request: ExecutionRequest, proposed: Risk, where: Placement) -> dict[str, object]:
    argv = request.argv
    network = where.network
    reach = [rule for rule in network.rules if rule.action is not EgressAction.DENY]
    return {
        "argv": sorted(set(argv)),
        "program": argv[0],
        "program_name": posixpath.basename(argv[0]),
        "command_line": shlex.join(argv),
        "env": sorted(request.env),
        "image": where.image,
        "namespace": where.namespace or "",
        "backend": where.backend,
        "target_namespace": request.target_namespace or "",
        "remediation_action": request.remediation_action or "",
        "network": network.mode is NetworkMode.RULES and bool(reach),
        "hosts": sorted({rule.domain for rule in reach if rule.domain}),
        "cidrs": sorted({rule.cidr for rule in reach if rule.cidr}),
        "credentials": any(rule.headers for rule in network.rules),
        "mounts": sorted({mount.source for mount in request.mounts}),
        "writable_mounts": any(mount.writable for mount in request.mounts),
        "proposed_risk": proposed.value,
    }


def _rules(policy: RiskPolicy, answer: cedarpy.AuthzResult) -> tuple[str, ...]:
    """The operator's rules behind ``answer``, in file order."""
    by_reason: dict[str, str] = answer.diagnostics.id_annotations_by_reason or {}
    matched = {by_reason.get(reason, reason) for reason in answer.diagnostics.reasons}
    return tuple(rule for rule in policy.order if rule in matched)


def _failed(why: str, proposed: Risk) -> Assessment:
    return Assessment(
        proposed,
        RiskSource.POLICY,
        (),
        f"the operator's risk policy could not be evaluated for this proposal, so it is "
        f"refused (fail closed): {why}",
    )


def _one_line(value: object) -> str:
    return " ".join(str(value).split())
