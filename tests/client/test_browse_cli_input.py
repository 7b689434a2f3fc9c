"""``ringfence browse``'s input, without a server: every mistake is one line on stderr and a
non-zero exit (2 for bad input), never a traceback; and the pure helpers it is built on."""

from __future__ import annotations

import io
import os
import subprocess

import click
import pytest

from ringfence.cli.browse import firewall_line, parse_firewall, read_actions
from ringfence.models.browser import FirewallReport
from tests.server.test_serve_process import RINGFENCE

# Nothing listens here: input checked before anything is sent never gets that far.
NOWHERE = {"RINGFENCE_URL": "http://127.0.0.1:9", "RINGFENCE_API_KEY": "rf_key"}


def _browse(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RINGFENCE, "browse", *args], env={**os.environ, **NOWHERE}, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((), "URL"),
        (("http://a.test/", "--action", "{not json"), "--action"),
        (("http://a.test/", "--action", "[1, 2]"), "--action"),
        (("http://a.test/", "--action", '{"type": "click"}'), "selector"),
        (("http://a.test/", "--action", '{"type": "fly"}'), "action"),
        (("http://a.test/", "--full-page"), "--screenshot"),
        (("http://a.test/", "--html", "--links"), "--json"),
        (("http://a.test/", "--firewall", "hidden,everything"), "everything"),
        (("http://a.test/", "--firewall", "hidden", "--no-firewall"), "--no-firewall"),
        (("http://a.test/", "--header", "no-colon"), "--header"),
        (("http://a.test/", "--cookie", "=v"), "--cookie"),
        (("http://a.test/", "--timeout", "0"), "--timeout"),
        (("file:///etc/passwd",), "http"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], named: str) -> None:
    done = _browse(*args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("ringfence: ") and named in line, line


def test_a_server_that_does_not_answer_is_one_line_and_exit_1() -> None:
    done = _browse("http://a.test/")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert "cannot reach the Ringfence server" in line


def test_actions_come_from_each_option_then_the_file_in_order() -> None:
    source = io.StringIO('[{"type": "press", "key": "Enter"}, {"type": "scrape"}]')
    actions = read_actions(['{"type": "write", "text": "a"}'], source)
    assert [a["type"] for a in actions] == ["write", "press", "scrape"]
    with pytest.raises(click.BadParameter):
        read_actions([], io.StringIO('{"type": "scrape"}'))  # a list, not one object


def test_the_firewall_options_and_its_report_line() -> None:
    assert parse_firewall(None, False) is None
    assert parse_firewall(None, True) == []
    assert parse_firewall(" hidden , aria_hidden", False) == ["hidden", "aria_hidden"]
    report = FirewallReport(
        rules=["hidden", "aria_hidden"], removed={"hidden": 2, "aria_hidden": 1},
        removed_chars=120,
    )  # fmt: skip
    assert firewall_line(report) == (
        "the semantic firewall removed 3 elements and 120 characters of text "
        "(aria_hidden 1, hidden 2)"
    )
    assert firewall_line(FirewallReport(rules=[])) == "the semantic firewall is off"
    assert firewall_line(FirewallReport(rules=["hidden"])).endswith("removed nothing")
