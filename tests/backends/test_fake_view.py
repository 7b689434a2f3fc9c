"""The fake runtime's view of the host (``testing.fakes.runtime.host_view``) never meets a
real sandbox's volume: ``bwrap --ro-bind / /`` copied them and failed when one was
removed in the middle of its walk (~1 start in 75 while real sandboxes came and went)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from ringfence.backends.local.volume import Volumes
from ringfence.testing.fakes.runtime import host_view

pytestmark = pytest.mark.integration


@pytest.fixture
def bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None or os.geteuid() != 0:
        pytest.skip("needs root (volumes) and bubblewrap")
    return found


def test_the_fakes_view_starts_while_volumes_come_and_go_and_shows_none(
    bwrap: str, open_tmp: Path
) -> None:
    runtime = open_tmp / "run"
    runtime.mkdir()
    home = open_tmp / "home"
    home.mkdir()
    volumes = Volumes(runtime)
    kept = volumes.create("rf-kept", 1 << 20, [("/usr", "/usr")], 65000, 65000)
    (kept.workspace / "secret").write_text("live")
    stop = threading.Event()

    def churn() -> None:
        n = 0
        while not stop.is_set():
            volumes.create(f"rf-churn{n}", 1 << 20, [("/usr", "/usr")], 65000, 65000).close()
            n += 1

    churner = threading.Thread(target=churn)
    churner.start()
    script = f"cat {kept.workspace}/secret 2>/dev/null || echo absent"
    failed = []
    try:
        for _ in range(300):
            done = subprocess.run(
                [*host_view(bwrap, home), "--", "sh", "-c", script],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if (done.returncode, done.stdout) != (0, "absent\n"):
                failed.append((done.returncode, done.stdout, done.stderr[:300]))
    finally:
        stop.set()
        churner.join()
        kept.close()
        volumes.close()
    assert failed == [], failed[:3]
