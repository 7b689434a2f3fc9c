"""The README's SDK examples, run as a new user runs them: a fresh process, nothing else on
stderr than what the example itself prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.conftest import LiveServer

pytestmark = pytest.mark.integration

_README = Path(__file__).parents[2] / "README.md"
_RUNS = 6  # the background-command warning came in about half the runs


def _python_block_after(heading: str) -> str:
    text = _README.read_text()
    section = text[text.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, f"no Python example under {heading!r}"
    return match.group(1)


def test_the_interactive_sandbox_example_leaves_stderr_clean(live: LiveServer) -> None:
    example = _python_block_after("## Interactive sandboxes")
    assert "background=True" in example and "h.kill()" in example
    # Each run in its own loop's life: a task left with an unretrieved error is reported
    # when it is collected, which gc.collect() forces before the next run.
    script = f"import gc\nfor _ in range({_RUNS}):\n" + "".join(
        f"    {line}\n" for line in [*example.splitlines(), "gc.collect()"]
    )
    environ = {**os.environ, "RINGFENCE_URL": live.url, "RINGFENCE_API_KEY": live.key}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, timeout=120, env=environ,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("0 42") == _RUNS and done.stdout.count("hello") == _RUNS
