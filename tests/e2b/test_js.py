"""The official E2B JavaScript SDKs (npm ``e2b``, ``@e2b/code-interpreter``), unmodified, run
with the machine's node against a real server: create, a command, a file written and read,
run_code, kill."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from tests.e2b.conftest import E2bServer

SCENARIO = Path(__file__).parents[1] / "js" / "e2b_scenario.mjs"


def test_js_sdk_scenario(e2b_server: E2bServer) -> None:
    node = shutil.which("node")
    assert node, "the machine's node is required (scripts/setup installs it)"
    done = subprocess.run(
        [node, str(SCENARIO)],
        cwd=SCENARIO.parent,
        env={**os.environ, "E2B_API_URL": e2b_server.url, "E2B_SANDBOX_URL": e2b_server.url,
             "E2B_API_KEY": e2b_server.key},
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "stdout": "hello from js\n",
        "stderr": "oops\n",
        "exitCode": 0,
        "exitError": "CommandExitError:3",
        "read": "written by js",
        "listed": ["js.txt"],
        "info": {"from": "js"},
        "killed": True,
        "runningAfterKill": False,
        "codeText": "42",
        "codeError": "ZeroDivisionError",
    }
