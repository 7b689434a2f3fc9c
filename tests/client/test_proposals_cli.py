"""``ringfence propose``, ``proposals``, ``approve`` and ``reject`` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

import pytest

from tests.client.conftest import LiveServer
from tests.server.test_serve_process import RINGFENCE


@dataclass(frozen=True)
class Keys:
    agent: str
    approver: str


@pytest.fixture(scope="module")
def keys(live: LiveServer) -> Keys:
    return Keys(live.mint_key("agent"), live.mint_key("approver"))


def _cli(live: LiveServer, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RINGFENCE_URL": live.url, "RINGFENCE_API_KEY": key}
    return subprocess.run([RINGFENCE, *args], env=env, capture_output=True, text=True, timeout=90)


def _propose(live: LiveServer, keys: Keys, *args: str) -> str:
    done = _cli(live, keys.agent, "propose", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.every_store
def test_propose_review_approve_and_wait(live: LiveServer, keys: Keys) -> None:
    proposed = _cli(
        live, keys.agent, "propose", "--rationale", "the lock is stale", "--env", "WHO=db",
        "--timeout", "30", "--session-id", "s-cli", "--remediation-action", "clear-lock",
        "--", "sh", "-c", 'echo "cleared $WHO"',
    )  # fmt: skip
    assert proposed.returncode == 0, proposed.stderr
    pid = proposed.stdout.strip()
    assert pid.startswith("cp") and "\n" not in pid
    assert pid in proposed.stderr and "pending" in proposed.stderr and "digest" in proposed.stderr

    table = _cli(live, keys.approver, "proposals", "list", "--state", "pending")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == [
        "ID", "STATE", "RISK", "APPROVALS", "PROPOSER", "CREATED", "COMMAND",
    ]  # fmt: skip
    row = next(r for r in rows if r.startswith(pid))
    assert "pending" in row and "0/1" in row and "sh -c" in row
    listed = json.loads(_cli(live, keys.approver, "proposals", "list", "--json").stdout)
    assert pid in [p["id"] for p in listed]

    shown = json.loads(_cli(live, keys.approver, "proposals", "show", pid, "--json").stdout)
    assert shown["request"]["command"] == ["sh", "-c", 'echo "cleared $WHO"']
    human = _cli(live, keys.approver, "proposals", "show", pid).stdout
    assert shown["digest"] in human and "sh -c 'echo \"cleared $WHO\"'" in human
    assert "the lock is stale" in human and "WHO=db" in human and "clear-lock" in human

    approved = _cli(
        live, keys.approver, "approve", pid, "--digest", shown["digest"], "--reason", "looked",
        "--wait", "--wait-timeout", "60",
    )  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.split() == [pid, "succeeded"]
    assert "exit code 0" in approved.stderr

    final = json.loads(_cli(live, keys.agent, "proposals", "show", pid, "--json").stdout)
    assert final["state"] == "succeeded" and final["result"]["logs"] == "cleared db\n"
    outcome = _cli(live, keys.agent, "proposals", "show", pid).stdout
    assert "looked" in outcome and "exit code 0" in outcome and "cleared db" in outcome

    replay = _cli(live, keys.approver, "approve", pid, "--digest", shown["digest"])
    assert replay.returncode == 1 and "Traceback" not in replay.stderr
    assert replay.stderr.startswith("ringfence: ") and replay.stderr.count("\n") == 1


def test_approve_wait_exits_1_when_the_remediation_fails(live: LiveServer, keys: Keys) -> None:
    pid = _propose(live, keys, "--rationale", "try", "--", "sh", "-c", "exit 3")
    done = _cli(live, keys.approver, "approve", pid, "--wait", "--json")
    assert done.returncode == 1, done.stderr
    proposal = json.loads(done.stdout)
    assert proposal["state"] == "failed" and proposal["result"]["exit_code"] == 3
    assert "exit code 3" in done.stderr


def test_reject_says_why(live: LiveServer, keys: Keys) -> None:
    pid = _propose(live, keys, "--rationale", "restart", "--", "true")
    missing_reason = _cli(live, keys.approver, "reject", pid)
    assert missing_reason.returncode == 2 and "--reason" in missing_reason.stderr
    done = _cli(live, keys.approver, "reject", pid, "--reason", "not now", "--json")
    assert done.returncode == 0, done.stderr
    proposal = json.loads(done.stdout)
    assert proposal["state"] == "rejected" and proposal["rejection"]["reason"] == "not now"
    shown = _cli(live, keys.agent, "proposals", "show", pid).stdout
    assert "rejected" in shown and "not now" in shown
    assert _cli(live, keys.agent, "proposals", "list", "--state", "rejected").stdout.count(pid) == 1


def test_errors_are_one_clear_line(live: LiveServer, keys: Keys) -> None:
    for key, args in (
        (keys.agent, ("proposals", "show", "cp-nope")),
        (keys.approver, ("approve", "cp-nope")),
        (keys.approver, ("reject", "cp-nope", "--reason", "x")),
        (live.other_key, ("proposals", "show", _propose(live, keys, "--rationale", "r", "true"))),
    ):
        done = _cli(live, key, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
        assert done.stderr.startswith("ringfence: no proposal with id"), done.stderr

    pid = _propose(live, keys, "--rationale", "mine", "--", "true")
    by_agent = _cli(live, keys.agent, "approve", pid)
    assert by_agent.returncode == 1 and "agent keys cannot approve" in by_agent.stderr
    wrong_digest = _cli(live, keys.approver, "approve", pid, "--digest", "0" * 64)
    assert wrong_digest.returncode == 1 and "Traceback" not in wrong_digest.stderr

    no_rationale = _cli(live, keys.agent, "propose", "--", "true")
    assert no_rationale.returncode == 2 and "--rationale" in no_rationale.stderr
    bad_env = _cli(live, keys.agent, "propose", "--rationale", "r", "--env", "NOEQUALS", "true")
    assert bad_env.returncode == 2 and "Traceback" not in bad_env.stderr
    bad_timeout = _cli(live, keys.agent, "propose", "--rationale", "r", "--timeout", "-1", "true")
    assert bad_timeout.returncode == 2 and "Traceback" not in bad_timeout.stderr
    bad_state = _cli(live, keys.agent, "proposals", "list", "--state", "maybe")
    assert bad_state.returncode == 2


def test_wait_timeout_exits_124(live: LiveServer, keys: Keys) -> None:
    pid = _propose(live, keys, "--rationale", "two needed", "--risk", "high", "--", "true")
    done = _cli(live, keys.approver, "approve", pid, "--wait", "--wait-timeout", "0.3")
    assert done.returncode == 124, done.stderr
    assert "still pending" in done.stderr and "Traceback" not in done.stderr
