"""E2B's JavaScript SDK (npm ``e2b``), unmodified: ``getMetrics`` on an instance and by id,
bounded by ``start``, and an ended sandbox not found."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from tests.e2b.conftest import E2bServer

SCRIPT = Path(__file__).parents[1] / "js" / "e2b_metrics.mjs"


def test_js_sdk_get_metrics(e2b_server: E2bServer) -> None:
    node = shutil.which("node")
    assert node, "the machine's node is required (scripts/setup installs it)"
    done = subprocess.run(
        [node, str(SCRIPT)],
        cwd=SCRIPT.parent,
        env={**os.environ, "E2B_API_URL": e2b_server.url, "E2B_SANDBOX_URL": e2b_server.url,
             "E2B_API_KEY": e2b_server.key},
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "first": 1,
        "fields": [True] * 7,
        "grew": True,
        "future": 0,
        "afterKill": "SandboxNotFoundError",
    }
