"""``pip install`` works in a sandbox as it comes: Debian's pip refuses to install anything
without a flag (PEP 668), and a sandbox's system is its read-only template anyway, so the
sandbox's environment sends installs to the user's home. Offline: a wheel made in the test."""

from __future__ import annotations

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.models import ExecutionRequest, Status

pytestmark = pytest.mark.integration

# Writes a minimal wheel of a module ``demo`` (a wheel is a zip with its metadata).
MAKE_WHEEL = """
import zipfile
with zipfile.ZipFile('/tmp/demo-1.0-py3-none-any.whl', 'w') as whl:
    whl.writestr('demo.py', 'X = 42\\n')
    info = 'demo-1.0.dist-info/'
    whl.writestr(info + 'METADATA', 'Metadata-Version: 2.1\\nName: demo\\nVersion: 1.0\\n')
    wheel = 'Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'
    whl.writestr(info + 'WHEEL', wheel)
    whl.writestr(info + 'RECORD', '')
"""


async def test_pip_installs_into_the_home_directory(local_executor: LocalExecutor) -> None:
    script = (
        f'python3 -c "{MAKE_WHEEL}" && '
        "python3 -m pip install --no-index --disable-pip-version-check -q "
        "/tmp/demo-1.0-py3-none-any.whl 2>&1 | grep -v 'Defaulting to user' ; "
        "cd / && python3 -c 'import demo; print(demo.X, demo.__file__)'"
    )
    result = await local_executor.execute(ExecutionRequest(command=["sh", "-c", script]))
    assert result.status is Status.SUCCEEDED, result.logs
    assert result.logs.splitlines()[-1].startswith("42 /home/user/.local/lib/python3"), result.logs
