"""Where a request would run, as the console shows it: defaults filled in, the cluster's
namespace and service account on the Kubernetes backend, and a warning where the server
cannot do what the request names. Pure: no server, no cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ringfence.config import Config
from ringfence.models import ExecutionRequest, Proposal, ProposalState, Risk, request_digest
from ringfence.policy.placement import placement
from ringfence.server.console.pages import expires_in, render

CONFIG = Config(
    namespace="rf-sandboxes",
    service_account="rf-remediator",
    runtime_class_name="gvisor",
    automount_service_account_token=True,
    network_defaults={"acme": {"rules": [{"domain": "evil.example", "action": "deny"}]}},
)


def test_on_the_kubernetes_backend_it_names_namespace_service_account_and_runtime() -> None:
    request = ExecutionRequest(command=["kubectl", "get", "pods"], target_namespace="shop")
    where = placement(request, "acme", CONFIG, "job")
    assert (where.cluster, where.namespace, where.service_account) == (
        True, "rf-sandboxes", "rf-remediator"
    )  # fmt: skip
    assert where.runtime_class == "gvisor" and where.automount_token
    assert where.image == CONFIG.kubernetes_image and where.warnings == ()
    assert where.limits == CONFIG.default_limits and where.timeout == CONFIG.default_timeout
    # The tenant's default applies when the request gives none: every rule is the operator's.
    assert [r.domain for r in where.network.rules] == ["evil.example"]
    assert where.by_operator == (True,)


def test_a_backend_without_a_cluster_says_so_and_names_nothing_of_one() -> None:
    request = ExecutionRequest(
        command=["kubectl", "delete", "pod", "x"], target_namespace="shop", namespace="ns"
    )
    where = placement(request, "acme", CONFIG, "local")
    assert not where.cluster and where.namespace is None and where.service_account is None
    assert len(where.warnings) == 1 and "cannot reach a Kubernetes cluster" in where.warnings[0]
    assert "'shop'" in where.warnings[0] and "'ns'" in where.warnings[0]
    assert placement(ExecutionRequest(command=["true"]), "acme", CONFIG, "local").warnings == ()
    process = placement(ExecutionRequest(command=["true"]), "acme", CONFIG, "process")
    assert any("NO isolation" in warning for warning in process.warnings)


def test_the_operators_rules_are_told_apart_and_header_values_are_redacted() -> None:
    request = ExecutionRequest(
        command=["true"],
        network={"rules": [{"domain": "api.example.com", "headers": {"Authorization": "tok"}}]},
    )
    where = placement(request, "acme", CONFIG, "local")
    assert [r.domain for r in where.network.rules] == ["api.example.com", "evil.example"]
    assert where.by_operator == (False, True)
    assert "tok" not in where.network.model_dump_json()


def test_the_page_shows_a_cluster_placement() -> None:
    request = ExecutionRequest(command=["kubectl", "get", "pods"], target_namespace="shop")
    now = datetime.now(UTC)
    proposal = Proposal(
        id="cp" + "0" * 20, state=ProposalState.PENDING, request=request,
        digest=request_digest(request), rationale="look", risk=Risk.LOW, proposed_by="k1",
        created_at=now, expires_at=now + timedelta(hours=1), required_approvals=1,
    )  # fmt: skip
    shown = {
        "proposal": proposal, "request": request, "rendered_digest": proposal.digest,
        "digest_holds": True, "placement": placement(request, "acme", CONFIG, "job"),
        "people": {"k1": "incident-bot"}, "expires_in": expires_in(proposal.expires_at, now),
    }  # fmt: skip
    html = bytes(
        render("history.html", session=None, csrf="", flash=[], now=now, proposals=[shown],
               asks=[], asks_enabled=False).body
    ).decode()  # fmt: skip
    for text in ("rf-remediator", "its token is mounted", "gvisor", "rf-sandboxes", "(Kubernetes)",
                 "incident-bot", "expires in 1 h 0 min"):  # fmt: skip
        assert text in html, text
    assert "cannot reach" not in html


def test_expires_in_reads_as_people_say_it() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert expires_in(now + timedelta(seconds=30), now) == "expires in 30 s"
    assert expires_in(now + timedelta(minutes=5, seconds=2), now) == "expires in 5 min"
    assert expires_in(now + timedelta(hours=2, minutes=3), now) == "expires in 2 h 3 min"
    assert expires_in(now - timedelta(minutes=3), now) == "closed 3 min ago"
