"""``ringfence propose``, ``proposals``, ``approve``, ``reject``: remediations that run only
once a human approves them, through the SDK.

The server is ``--url`` / ``--api-key``, else ``RINGFENCE_URL`` / ``RINGFENCE_API_KEY``.
Errors are one line on stderr: exit 2 for bad input, 1 otherwise. ``approve --wait`` exits
0 when the remediation succeeded, 1 when it failed (or was rejected or expired), 124 when
the wait timed out.
"""

from __future__ import annotations

import json
import shlex
from datetime import datetime
from typing import TYPE_CHECKING

import click

from ringfence.cli._common import fail
from ringfence.cli.sandbox import api_options, client_errors

if TYPE_CHECKING:
    from ringfence.models import Decision, Proposal

__all__ = ["approve", "proposals", "propose", "reject"]

EXIT_TIMEOUT = 124  # as timeout(1)
_STATES = ["pending", "approved", "rejected", "expired", "executing", "succeeded", "failed"]
_LOG_TAIL_LINES = 20
_COMMAND_WIDTH = 60


def _env(items: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.UsageError(f"--env takes K=V, got {item!r}")
        env[name] = value
    return env


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def _command(proposal: Proposal) -> str:
    return shlex.join(proposal.request.argv)


def _summary(proposal: Proposal) -> str:
    """One line on where a proposal stands, for stderr."""
    got, needed = len(proposal.approvals), proposal.required_approvals
    line = f"{proposal.id}: {proposal.state.value}, {got}/{needed} approvals"
    if proposal.state == "pending":
        line += f", expires {_when(proposal.expires_at)}"
    return f"{line}; digest {proposal.digest}"


@click.command("propose", context_settings={"allow_interspersed_args": False})
@click.option(
    "--rationale", required=True, help="Why it should run: what the approver reads first."
)
@click.option(
    "--risk",
    type=click.Choice(["low", "high"]),
    default="low",
    show_default=True,
    help="high needs more than one approver.",
)
@click.option("--timeout", type=float, help="Wall-clock limit of the run, in seconds.")
@click.option("--env", "env_items", multiple=True, metavar="K=V", help="Set a variable.")
@click.option("--target-namespace", help="The namespace the remediation acts on.")
@click.option("--remediation-action", help="A name for the action, for the record.")
@click.option("--session-id", help="The agent session proposing it.")
@click.option("--task-id", help="The task within the session.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole proposal as JSON.")
@api_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def propose(
    rationale: str,
    risk: str,
    timeout: float | None,
    env_items: tuple[str, ...],
    target_namespace: str | None,
    remediation_action: str | None,
    session_id: str | None,
    task_id: str | None,
    as_json: bool,
    url: str | None,
    api_key: str | None,
    command: tuple[str, ...],
) -> None:
    """Propose running COMMAND once a human approves it; print the proposal's id.

    \b
    Example:
      ringfence propose --rationale 'pod crash-loops on a stale lock' \\
          --remediation-action clear-lock -- rm -f /data/app.lock
    """
    from ringfence.client import Ringfence

    fields = {
        name: value
        for name, value in {
            "timeout": timeout,
            "target_namespace": target_namespace,
            "remediation_action": remediation_action,
        }.items()
        if value is not None
    }
    env = _env(env_items)
    with client_errors(), Ringfence(url, api_key) as rf:
        proposal = rf.proposals.create(
            list(command), rationale=rationale, risk=risk, session_id=session_id,
            task_id=task_id, env=env, **fields,
        )  # fmt: skip
    if as_json:
        click.echo(proposal.model_dump_json(indent=2))
        return
    click.echo(proposal.id)
    click.echo(f"proposed {_summary(proposal)}", err=True)


@click.group("proposals")
def proposals() -> None:
    """List and show proposals; 'approve' and 'reject' decide them."""


@proposals.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(_STATES),
    help="Only in this state (repeatable).",
)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print the proposals as JSON.")
@api_options
def list_(
    states: tuple[str, ...], limit: int, as_json: bool, url: str | None, api_key: str | None
) -> None:
    """Your tenant's proposals, newest first."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        found = rf.proposals.list(state=states, limit=limit)
    if as_json:
        click.echo(json.dumps([p.model_dump(mode="json") for p in found], indent=2))
        return
    rows = [("ID", "STATE", "RISK", "APPROVALS", "PROPOSER", "CREATED", "COMMAND")]
    for p in found:
        command = _command(p)
        if len(command) > _COMMAND_WIDTH:
            command = command[: _COMMAND_WIDTH - 3] + "..."
        rows.append((
            p.id, p.state.value, p.risk.value, f"{len(p.approvals)}/{p.required_approvals}",
            p.proposed_by, _when(p.created_at), command,
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@proposals.command("show")
@click.argument("proposal_id")
@click.option("--json", "as_json", is_flag=True, help="Print the proposal as JSON.")
@api_options
def show(proposal_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """Everything about a proposal: the exact request, its digest, the decisions, the result."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        proposal = rf.proposals.get(proposal_id)
    if as_json:
        click.echo(proposal.model_dump_json(indent=2))
        return
    for line in _describe(proposal):
        click.echo(line)


def _risk_by(p: Proposal) -> str:
    if p.risk_source.value == "policy":
        return f"set by the operator's risk policy, rule {', '.join(p.risk_rules)}"
    return "as proposed"


def _describe(p: Proposal) -> list[str]:
    request = p.request
    fields: list[tuple[str, object]] = [
        ("id", p.id),
        ("state", p.state.value),
        ("risk", f"{p.risk.value} (needs {p.required_approvals} approver(s); {_risk_by(p)})"),
        ("proposed by", f"{p.proposed_by} at {_when(p.created_at)}"),
        ("expires", _when(p.expires_at)),
        ("session", p.session_id),
        ("task", p.task_id),
        ("rationale", p.rationale),
        ("command", _command(p)),
        ("env", " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(request.env.items()))),
        ("cwd", request.cwd),
        ("image", request.image),
        ("timeout", request.timeout),
        ("limits", request.limits.model_dump_json(exclude_none=True)),
        ("mounts", ", ".join(m.model_dump_json() for m in request.mounts)),
        ("target namespace", request.target_namespace),
        ("remediation", request.remediation_action),
        ("digest", p.digest),
    ]
    lines = [f"{name + ':':<18}{value}" for name, value in fields if value not in (None, "", "{}")]
    lines.append(f"{'approvals:':<18}{len(p.approvals)}/{p.required_approvals}")
    lines += [f"  - {_decision(d)}" for d in p.approvals]
    if p.rejection is not None:
        lines.append(f"{'rejected:':<18}{_decision(p.rejection)}")
    if p.execution_id is not None:
        lines.append(f"{'execution:':<18}{p.execution_id}")
    if p.result is not None:
        result = p.result
        status = result.status.value
        if result.exit_code is not None:
            status += f", exit code {result.exit_code}"
        if result.error:
            status += f" ({result.error})"
        lines.append(f"{'result:':<18}{status}")
        tail = result.logs.splitlines()[-_LOG_TAIL_LINES:]
        if tail:
            lines.append(f"log (last {len(tail)} lines):")
            lines += [f"  {line}" for line in tail]
    return lines


def _decision(decision: Decision) -> str:
    reason = f": {decision.reason}" if decision.reason else ""
    return f"{decision.by} at {_when(decision.at)}{reason}"


@click.command("approve")
@click.argument("proposal_id")
@click.option("--reason", default="", help="Why, for the record.")
@click.option(
    "--digest",
    help="The digest you reviewed ('proposals show'); refused if the request is not that one. "
    "Without it, whatever the proposal holds now is approved.",
)
@click.option("--wait", is_flag=True, help="Wait for the outcome; exit 0 if it succeeded.")
@click.option("--wait-timeout", type=float, help="With --wait: give up after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the proposal as JSON.")
@api_options
def approve(
    proposal_id: str,
    reason: str,
    digest: str | None,
    wait: bool,
    wait_timeout: float | None,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Approve a proposal (approver and admin keys). With enough approvals it runs at once."""
    from ringfence.client import Ringfence, WaitTimeout

    with client_errors(), Ringfence(url, api_key) as rf:
        proposal = rf.proposals.approve(proposal_id, digest=digest, reason=reason)
        if wait:
            click.echo(f"approved {_summary(proposal)}; waiting for the outcome", err=True)
            try:
                proposal = rf.proposals.wait(proposal_id, timeout=wait_timeout)
            except WaitTimeout as exc:
                fail(exc.message, EXIT_TIMEOUT)
    _print_decided(proposal, as_json)
    if wait:
        if proposal.result is not None:
            _report_result(proposal)
        raise SystemExit(0 if proposal.state == "succeeded" else 1)


@click.command("reject")
@click.argument("proposal_id")
@click.option("--reason", required=True, help="Why: it is recorded, and the proposer sees it.")
@click.option("--json", "as_json", is_flag=True, help="Print the proposal as JSON.")
@api_options
def reject(
    proposal_id: str, reason: str, as_json: bool, url: str | None, api_key: str | None
) -> None:
    """Reject a proposal (approver and admin keys): it never runs."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        proposal = rf.proposals.reject(proposal_id, reason=reason)
    _print_decided(proposal, as_json)


def _print_decided(proposal: Proposal, as_json: bool) -> None:
    if as_json:
        click.echo(proposal.model_dump_json(indent=2))
    else:
        click.echo(f"{proposal.id} {proposal.state.value}")


def _report_result(proposal: Proposal) -> None:
    assert proposal.result is not None
    result = proposal.result
    words = [f"{proposal.id}: the remediation {result.status.value}"]
    if result.exit_code is not None:
        words.append(f"with exit code {result.exit_code}")
    if result.error:
        words.append(f"({result.error})")
    click.echo(" ".join(words), err=True)
