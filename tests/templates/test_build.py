"""``ringfence template build``: a real debootstrap build of the shipped ``code-interpreter``
recipe, whose sandboxes run its own binaries and whose code contexts give rich results.

Minutes the first time (downloads); the packages are cached under /var/cache/ringfence, so
a second run downloads only the indexes. Never skipped: scripts/setup installs debootstrap.
"""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.client import Sandbox
from ringfence.config import Config
from ringfence.models import ExecutionRequest, Status
from ringfence.templates import resolve
from tests.server.test_serve_process import Server

RINGFENCE = str(Path(sys.executable).parent / "ringfence")

pytestmark = [pytest.mark.integration, pytest.mark.debootstrap]


@pytest.fixture(scope="module")
def built() -> Iterator[Path]:
    """The data directory of a server whose registry holds a fresh ``code-interpreter``."""
    assert shutil.which("debootstrap"), "scripts/setup installs debootstrap"
    root = Path(tempfile.mkdtemp(prefix="ringfence-test-", dir="/tmp"))
    root.chmod(0o755)  # the unprivileged sandbox user traverses it
    data_dir = root / "data"
    started = time.monotonic()
    build = subprocess.run(
        [RINGFENCE, "template", "build", "code-interpreter", "--data-dir", str(data_dir)],
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
    yield data_dir
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(1800)
async def test_a_debian_template_runs_its_own_binaries(
    built: Path, local_executor: LocalExecutor
) -> None:
    image = resolve("code-interpreter", Config(data_dir=built))
    result = await local_executor.execute(
        ExecutionRequest(
            image=image,
            command=["/bin/sh", "-c"],
            args=["python3 -c 'import sys; print(sys.prefix)'; cat /etc/debian_version; "
                  "node -e 'console.log(6 * 7)'; jq -n 1+1; python3 -m pip --version | cut -c1-4; "
                  "touch /usr/bin/python3 2>/dev/null || echo read-only"],
        )
    )  # fmt: skip
    assert result.status is Status.SUCCEEDED, result.logs
    prefix, version, node, jq, pip, read_only = result.logs.splitlines()
    assert (prefix, node, jq, pip, read_only) == ("/usr", "42", "2", "pip ", "read-only")
    assert version == (Path(image) / "etc" / "debian_version").read_text().strip()

    listed = subprocess.run(
        [RINGFENCE, "template", "list", "--json", "--data-dir", str(built)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    [metadata] = json.loads(listed.stdout)
    assert (metadata["name"], metadata["source"]) == ("code-interpreter", "build")
    assert {"python3-pandas", "python3-matplotlib", "nodejs", "python3-pip"} <= set(
        metadata["packages"]
    )
    assert metadata["size_bytes"] > 200 << 20 and metadata["stripped_setuid"] > 0
    assert not list(Path(image).parent.parent.glob(".build-*")), "no staging copy left"
    assert str(built.parent) not in Path("/proc/self/mountinfo").read_text(), "nothing mounted"


@pytest.mark.timeout(1800)
def test_the_code_interpreter_template_gives_rich_stateful_results(built: Path) -> None:
    """The issue's acceptance, through a real server and the SDK, on the built template."""
    server = Server(built, None)
    server.start()
    try:
        key = (built / "admin-key").read_text().strip()
        with Sandbox.create("code-interpreter", url=server.url, api_key=key) as sandbox:
            where = sandbox.commands.run("python3 -c 'import pandas; print(pandas.__file__)'")
            assert where.stdout.startswith("/usr/lib/python3/dist-packages/pandas/")
            assert sandbox.run_code("x = 20").error is None
            assert sandbox.run_code("x + 22").text == "42"  # stateful
            frame = sandbox.run_code(
                "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"
            )
            assert "<table" in (frame.results[0].html or "")
            plot = sandbox.run_code(
                "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"
            )
            [figure] = [r for r in plot.results if r.png]
            width, height = _png_size(base64.b64decode(figure.png or ""))
            assert width > 100 and height > 100
            failed = sandbox.run_code("1 / 0")
            assert failed.error is not None and failed.error.name == "ZeroDivisionError"
            assert "1 / 0" in failed.error.traceback
            other = sandbox.create_code_context()
            unseen = sandbox.run_code("x", context=other)
            assert unseen.error is not None and unseen.error.name == "NameError"
            assert sandbox.run_code("[1, 2].map(n => n * 21)[1]", language="javascript").text == (
                "42"
            )
    finally:
        server.stop()


def _png_size(data: bytes) -> tuple[int, int]:
    """Decode a PNG far enough to know it is one: every chunk's CRC, the pixel data's size.

    Raises AssertionError when it is not a well-formed 8-bit PNG."""
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), "the PNG signature"
    at, chunks = 8, {}
    idat = b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{kind!r} chunk corrupt"
        chunks[kind] = body
        idat += body if kind == b"IDAT" else b""
        at += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
    assert depth == 8 and b"IEND" in chunks
    assert len(zlib.decompress(idat)) == height * (1 + width * channels), "whole pixel rows"
    return width, height
