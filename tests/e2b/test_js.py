"""The official E2B JavaScript SDKs (npm ``e2b``, ``@e2b/code-interpreter``), unmodified, run
with the machine's node against a real server: the lifecycle (create, connect, list,
set_timeout, get_info, kill), commands (timeout, background, list, kill), files (list order,
metadata, exists, rename, remove of nothing, watch), and the code interpreter (contexts,
whole-line output, ESM JavaScript, charts, DataFrame data)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from tests.e2b.conftest import E2bServer

SCENARIO = Path(__file__).parents[1] / "js" / "e2b_scenario.mjs"
VOLUMES = SCENARIO.with_name("e2b_volumes.mjs")


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
        "deep": ["a", "a/z.txt", "b.txt"],
        "writeMetadata": {"who": "js"},
        "infoMetadata": {"who": "js"},
        "exists": [True, False],
        "renamed": "/home/user/meta2.txt",
        "watched": ["b.txt:write"],
        "timeoutError": "TimeoutError",
        "listedPid": True,
        "killedPid": True,
        "connected": True,
        "listedSandbox": True,
        "defaultContexts": ["javascript", "python"],
        "wholeLines": ["1\n"],
        "esm": "a/b",
        "chart": ["line", "js"],
        "data": {"a": [1, 2]},
        "contextsAfterRemove": 2,
    }


def test_js_sdk_volumes(e2b_server: E2bServer) -> None:
    node = shutil.which("node")
    assert node, "the machine's node is required (scripts/setup installs it)"
    done = subprocess.run(
        [node, str(VOLUMES)],
        cwd=VOLUMES.parent,
        env={**os.environ, "E2B_API_URL": e2b_server.url, "E2B_SANDBOX_URL": e2b_server.url,
             "E2B_VOLUME_API_URL": e2b_server.url, "E2B_API_KEY": e2b_server.key},
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    name = seen.pop("name")
    assert name.startswith("js-")
    assert seen == {
        "listed": True,
        "written": ["/js/a.txt", 7, 1000],
        "read": "from js",
        "entries": ["a.txt"],
        "inside": "from js",
        "mounts": [{"name": name, "path": "/mnt/data"}],
        "back": "from sandbox\n",
        "destroyed": True,
    }
