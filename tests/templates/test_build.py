"""``ringfence template build``: a real debootstrap build whose sandbox runs its own python3.

Minutes the first time (downloads); the packages are cached under /var/cache/ringfence, so
a second run downloads only the indexes. Never skipped: scripts/setup installs debootstrap.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.config import Config
from ringfence.models import ExecutionRequest, Status
from ringfence.templates import resolve

RINGFENCE = str(Path(sys.executable).parent / "ringfence")

pytestmark = [pytest.mark.integration, pytest.mark.debootstrap]


@pytest.mark.timeout(1800)
async def test_a_debian_template_runs_its_own_python(
    local_executor: LocalExecutor, open_tmp: Path
) -> None:
    assert shutil.which("debootstrap"), "scripts/setup installs debootstrap"
    data_dir = open_tmp / "data"
    started = time.monotonic()
    build = subprocess.run(
        [RINGFENCE, "template", "build", "py", "--recipe", "minbase", "--packages", "python3",
         "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=1700,
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert build.returncode == 0, build.stderr[-3000:]
    stages = build.stderr.splitlines()
    assert (
        "debootstrap: retrieving packages" in stages or "debootstrap: extracting packages" in stages
    )
    assert len(stages) < 80, "progress is condensed to stage lines"
    print(f"\ntemplate build took {seconds:.0f} s")  # first vs cached: see docs/templates.md

    image = resolve("py", Config(data_dir=data_dir))
    result = await local_executor.execute(
        ExecutionRequest(
            image=image,
            command=["/bin/sh", "-c"],
            args=["python3 -c 'import sys; print(sys.prefix)'; cat /etc/debian_version; "
                  "touch /usr/bin/python3 2>/dev/null || echo read-only"],
        )
    )  # fmt: skip
    assert result.status is Status.SUCCEEDED, result.logs
    prefix, version, read_only = result.logs.splitlines()
    assert prefix == "/usr" and read_only == "read-only"
    assert version == (Path(image) / "etc" / "debian_version").read_text().strip()

    listed = subprocess.run(
        [RINGFENCE, "template", "list", "--json", "--data-dir", str(data_dir)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    [metadata] = json.loads(listed.stdout)
    assert (metadata["name"], metadata["source"], metadata["packages"]) == (
        "py", "build", ["python3"]
    )  # fmt: skip
    assert metadata["size_bytes"] > 50 << 20 and metadata["stripped_setuid"] > 0
    assert not list(Path(image).parent.parent.glob(".build-*")), "no staging copy left"
    assert str(open_tmp) not in Path("/proc/self/mountinfo").read_text(), "nothing mounted"
