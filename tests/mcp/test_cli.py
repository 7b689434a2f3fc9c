"""``ringfence mcp`` on the command line."""

from __future__ import annotations

import os
import subprocess

from tests.server.test_serve_process import RINGFENCE


def test_without_a_key_it_says_so_and_exits_2() -> None:
    environment = {k: v for k, v in os.environ.items() if k != "RINGFENCE_API_KEY"}
    done = subprocess.run(
        [RINGFENCE, "mcp"],
        capture_output=True,
        text=True,
        env=environment,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert "no API key" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == "", "stdout is the protocol's: nothing else is written there"


def test_its_help_says_how_it_is_used() -> None:
    done = subprocess.run([RINGFENCE, "mcp", "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    assert "stdin/stdout" in done.stdout and "RINGFENCE_API_KEY" in done.stdout


def test_it_ends_quietly_when_its_client_closes_stdin() -> None:
    done = subprocess.run(
        [RINGFENCE, "mcp", "--api-key", "rf_0000000000000000_" + "x" * 43],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_a_url_that_is_not_http_is_refused_at_once() -> None:
    for url in ("localhost:8080", "ftp://host", "http://"):
        done = subprocess.run(
            [RINGFENCE, "mcp", "--url", url, "--api-key", "rf_x"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, (url, done.stderr)
        assert "http://host:port" in done.stderr and "Traceback" not in done.stderr
