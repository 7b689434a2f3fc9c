"""The operator's risk policy (Cedar), as pure functions: what it raises, what it forbids,
that a proposer cannot go below it, that a bad file is refused whole, and that an
evaluation error refuses the proposal (fail closed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ExecutionRequest, Risk, RiskSource
from ringfence.policy.placement import placement
from ringfence.policy.risk import RiskPolicy, assess, load_risk_policy

POLICY = """
@id("kubectl-writes-are-high")
permit (principal, action == Ringfence::Action::"high_risk", resource)
when { context.program_name == "kubectl" &&
       ["delete", "scale", "patch", "apply"].containsAny(context.argv) };

@id("production-is-high")
permit (principal, action == Ringfence::Action::"high_risk", resource)
when { context.target_namespace like "prod*" };

@id("agents-with-network-are-high")
permit (principal, action == Ringfence::Action::"high_risk", resource)
when { principal.role == "agent" && context.network };

@id("never-kube-system")
forbid (principal, action == Ringfence::Action::"propose", resource)
when { context.target_namespace == "kube-system" };

@id("only-our-images")
forbid (principal, action == Ringfence::Action::"propose", resource)
unless { context.image == "host" || context.image like "/srv/images/*" };

@id("no-credentials-for-globex")
forbid (principal in Ringfence::Tenant::"globex", action == Ringfence::Action::"propose",
        resource)
when { context.credentials };

@id("no-preload")
forbid (principal, action == Ringfence::Action::"propose", resource)
when { context.env.contains("LD_PRELOAD") || context.env.contains("BASH_ENV") };
"""


def _policy(tmp_path: Path, text: str = POLICY) -> RiskPolicy:
    path = tmp_path / "risk.cedar"
    path.write_text(text)
    policy = load_risk_policy(path)
    assert policy is not None
    return policy


def _assess(
    policy: RiskPolicy | None,
    proposed: Risk = Risk.LOW,
    tenant: str = "acme",
    role: str = "agent",
    config: Config | None = None,
    backend: str = "local",
    **request: Any,
) -> Any:
    asked = ExecutionRequest(**{"command": ["sh", "-c", "true"], **request})
    return assess(
        policy, asked, tenant=tenant, requester="k-agent", role=role, proposed=proposed,
        where=placement(asked, tenant, config or Config(), backend),
    )  # fmt: skip


def test_the_policy_raises_a_low_proposal_to_high_and_names_the_rule(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    raised = _assess(policy, command=["kubectl", "delete", "pod", "web-0"])
    assert (raised.risk, raised.source, raised.rules) == (
        Risk.HIGH, RiskSource.POLICY, ("kubectl-writes-are-high",)
    )  # fmt: skip
    both = _assess(policy, command=["/usr/bin/kubectl", "scale"], target_namespace="prod-eu")
    assert both.rules == ("kubectl-writes-are-high", "production-is-high")  # in file order
    reads = _assess(policy, command=["kubectl", "get", "pods"], target_namespace="staging")
    assert (reads.risk, reads.source, reads.rules) == (Risk.LOW, RiskSource.PROPOSER, ())


def test_a_proposer_may_raise_the_risk_but_not_lower_it(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    raised = _assess(policy, Risk.HIGH, command=["kubectl", "get", "pods"])
    assert (raised.risk, raised.source) == (Risk.HIGH, RiskSource.PROPOSER)
    for proposed in Risk:  # whatever the proposer says, the operator's high stands
        kept = _assess(policy, proposed, command=["kubectl", "patch", "deploy/web"])
        assert (kept.risk, kept.source) == (Risk.HIGH, RiskSource.POLICY), proposed


def test_network_reach_and_the_requester_are_seen_as_they_would_run(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    reach = {"rules": [{"domain": "pypi.org"}]}
    assert _assess(policy, network=reach).rules == ("agents-with-network-are-high",)
    assert _assess(policy, role="approver", network=reach).risk is Risk.LOW
    denied_only = {"rules": [{"domain": "pypi.org", "action": "deny"}]}
    assert _assess(policy, network=denied_only).risk is Risk.LOW
    # No policy given: the tenant's default applies, and the policy sees it.
    config = Config(network_defaults={"acme": {"rules": [{"domain": "pypi.org"}]}})
    assert _assess(policy, config=config).rules == ("agents-with-network-are-high",)


def test_forbid_rules_refuse_by_namespace_image_credentials_tenant_and_env(
    tmp_path: Path,
) -> None:
    policy = _policy(tmp_path)
    credential = {"rules": [{"domain": "api.example.com", "headers": {"Authorization": "x"}}]}
    cases: dict[str, dict[str, Any]] = {
        "never-kube-system": {"target_namespace": "kube-system"},
        "only-our-images": {"image": "/tmp/evil-root"},
        "no-credentials-for-globex": {"tenant": "globex", "network": credential},
        "no-preload": {"env": {"LD_PRELOAD": "/tmp/x.so"}},
    }
    for why, kwargs in cases.items():
        refused = _assess(policy, **kwargs)
        assert refused.refusal is not None and why in refused.refusal, why
        assert refused.rules == (why,)
    assert _assess(policy, network=credential).refusal is None  # acme may broker credentials
    assert _assess(policy, image="/srv/images/tools").refusal is None


def test_image_namespace_and_backend_are_the_ones_it_would_run_with(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path,
        """
        @id("cluster-work-is-high")
        permit (principal, action == Ringfence::Action::"high_risk", resource)
        when { context.backend == "job" && context.namespace == "ringfence-sandboxes" &&
               context.image == "python:3.12-slim" };
        """,
    )
    assert _assess(policy, backend="job").rules == ("cluster-work-is-high",)
    assert _assess(policy, backend="local").risk is Risk.LOW  # no namespace, the host image


def test_without_a_policy_the_proposers_risk_stands() -> None:
    assert load_risk_policy(None) is None
    for proposed in Risk:
        kept = _assess(None, proposed, command=["kubectl", "delete", "ns", "prod"])
        assert (kept.risk, kept.source, kept.refusal) == (proposed, RiskSource.PROPOSER, None)


def test_an_evaluation_error_refuses_the_proposal(tmp_path: Path) -> None:
    # Valid against the schema, but it overflows when evaluated: Cedar would skip this forbid
    # and let the proposal through; Ringfence refuses it instead.
    policy = _policy(
        tmp_path,
        """
        @id("overflowing")
        forbid (principal, action == Ringfence::Action::"propose", resource)
        when { context.argv.contains("boom") && 9223372036854775807 + 1 > 0 };
        """,
    )
    refused = _assess(policy, command=["echo", "boom"])
    assert refused.refusal is not None and "fail closed" in refused.refusal
    assert _assess(policy, command=["echo", "fine"]).refusal is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("permit (principal, action, resource", "not a Cedar policy set"),
        ("", "no policy"),
        (
            '@id("typo")\nforbid (principal, action == Ringfence::Action::"propose", resource)'
            ' when { context.programm == "x" };',
            "programm",
        ),
        (
            '@id("x")\nforbid (principal, action == Ringfence::Action::"deploy", resource);',
            "deploy",
        ),
        ('forbid (principal, action == Ringfence::Action::"propose", resource);', "@id"),
        (
            '@id("a")\nforbid (principal, action == Ringfence::Action::"propose", resource);\n'
            '@id("a")\nforbid (principal, action == Ringfence::Action::"propose", resource);',
            "share",
        ),
        (
            '@id("t")\nforbid (principal == ?principal, action, resource);',
            "templates",
        ),
    ],
)
def test_a_bad_policy_file_is_refused_with_one_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "risk.cedar"
    path.write_text(text)
    with pytest.raises(InvalidRequest) as refused:
        load_risk_policy(path)
    assert says in refused.value.message and "\n" not in refused.value.message
    assert str(path) in refused.value.message


def test_a_missing_policy_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as refused:
        load_risk_policy(tmp_path / "nope.cedar")
    assert "cannot read" in refused.value.message
