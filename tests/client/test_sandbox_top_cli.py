"""``ringfence sandbox top`` and the SDK's ``metrics()`` against a real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import UTC, datetime

from ringfence.cli.sandbox_top import render
from ringfence.client import Sandbox
from ringfence.models import Sandbox as SandboxInfo
from ringfence.models import SandboxMetrics, SandboxState
from tests._interrupt import interruptible
from tests.client.conftest import LiveServer
from tests.server.test_serve_process import RINGFENCE


def _env(live: LiveServer) -> dict[str, str]:
    return {**os.environ, "RINGFENCE_URL": live.url, "RINGFENCE_API_KEY": live.key}


def test_metrics_and_top_show_a_running_sandbox(live: LiveServer) -> None:
    with Sandbox.create(url=live.url, api_key=live.key, limits={"memory": "256M"}) as sbx:
        metrics = sbx.metrics()
        assert metrics.sandbox_id == sbx.sandbox_id
        assert metrics.memory_limit == 256 << 20 and metrics.pids >= 1

        once = subprocess.run([RINGFENCE, "sandbox", "top", "--once"], env=_env(live),
                              capture_output=True, timeout=60)  # fmt: skip
        assert once.returncode == 0, once.stderr
        header, *rows = once.stdout.decode().splitlines()
        assert header.split() == ["ID", "STATE", "CPU%", "CPUS", "MEMORY", "DISK", "PIDS"]
        line = next(row for row in rows if row.startswith(sbx.sandbox_id))
        assert "running" in line and "/256M" in line

        as_json = subprocess.run([RINGFENCE, "sandbox", "top", "--once", "--json"],
                                 env=_env(live), capture_output=True, timeout=60)  # fmt: skip
        samples = json.loads(as_json.stdout)
        assert sbx.sandbox_id in [s["sandbox_id"] for s in samples]

        refreshing = subprocess.Popen([RINGFENCE, "sandbox", "top", "--interval", "0.5"],
                                      env=_env(live), stdout=subprocess.PIPE,
                                      preexec_fn=interruptible)  # fmt: skip
        try:
            assert refreshing.stdout is not None
            seen = b""
            deadline = time.monotonic() + 30
            while seen.count(sbx.sandbox_id.encode()) < 2 and time.monotonic() < deadline:
                seen += os.read(refreshing.stdout.fileno(), 65536)
            assert seen.count(sbx.sandbox_id.encode()) >= 2, seen  # refreshed at least once
            assert b"\x1b[2J" in seen
        finally:
            refreshing.send_signal(signal.SIGINT)
            # Its output is read to the end: a pipe nobody reads fills, and a top blocked
            # writing to it never gets to its ^C.
            refreshing.communicate(timeout=30)
            assert refreshing.returncode == 0


def test_top_needs_once_for_json(live: LiveServer) -> None:
    done = subprocess.run([RINGFENCE, "sandbox", "top", "--json"], env=_env(live),
                          capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and b"--once" in done.stderr


def test_render_shows_limits_and_sandboxes_it_could_not_read() -> None:
    now = datetime.now(UTC)
    info = SandboxInfo.model_validate({
        "id": "sb-one", "state": "running", "template": "base", "created_at": now,
        "expires_at": now, "limits": {}, "metadata": {},
    })  # fmt: skip
    gone = info.model_copy(update={"id": "sb-two", "state": SandboxState.PAUSED})
    metrics = SandboxMetrics(
        sandbox_id="sb-one", timestamp=now, cpu_seconds=1.5, cpu_percent=42.25, cpus=0.5,
        memory_bytes=3 << 20, memory_limit=256 << 20, disk_bytes=0, disk_limit=0, pids=4,
    )  # fmt: skip
    table = render([(info, metrics), (gone, None)]).splitlines()
    assert table[1].split() == ["sb-one", "running", "42.2", "0.5", "3.0M/256M", "(1%)", "0B", "4"]
    assert table[2].split() == ["sb-two", "paused", "-", "-", "-", "-", "-"]
    assert render([]).splitlines()[-1] == "(no running sandboxes)"
