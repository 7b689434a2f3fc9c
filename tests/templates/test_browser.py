"""The shipped ``browser`` recipe: a real build (shared by the run: ``_shared``), with its
progress and metadata, and what it promises running inside a sandbox made from it under the
browser limits (``Config.browser_memory``, ``browser_pids``): Debian's Chromium from
bookworm-security, headless Chromium rendering a page to a real PNG, and the Markdown
converter in the template's python3 (issue 19). Chromium's own needs are measured in
docs/templates.md; below them it cannot start."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import AsyncIterator

import pytest

from ringfence.backends import LiveSandbox
from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.backends.local.probe import Host
from ringfence.config import Config
from ringfence.models import ResourceLimits
from ringfence.templates import Registry
from ringfence.templates.build import PYPI_RECIPES, RECIPES
from ringfence.testing.backend_checks import run_in_sandbox
from tests.templates._shared import Built, shared_template

# The first test to run waits for the build (minutes): each is bounded as a build is.
pytestmark = [pytest.mark.integration, pytest.mark.debootstrap, pytest.mark.timeout(1800)]

# A white page with a 300x200 red block: a blank or failed render has no red in it.
PAGE = (
    "<html><body style='margin:0;background:#fff'><h1>Ringfence</h1>"
    "<div style='width:300px;height:200px;background:#ff0000'></div></body></html>"
)
HEADLESS = "chromium --headless --no-sandbox --disable-gpu --no-first-run"


@pytest.fixture(scope="module")
def browser() -> Built:
    built = shared_template("browser")
    print(f"\nbrowser template: built in {built.seconds:.0f} s")  # see docs/templates.md
    return built


async def _start(
    built: Built, host: Host, limits: ResourceLimits
) -> tuple[LiveSandbox, LocalSandboxRuntime]:
    config = Config()
    runtime = LocalSandboxRuntime(LocalExecutor(config, host=host), config)
    spec = LaunchSpec(image=str(built.rootfs), env={}, limits=limits, timeout=600)
    return await runtime.start(spec), runtime


@pytest.fixture
async def sandbox(browser: Built, local_host: Host) -> AsyncIterator[LiveSandbox]:
    config = Config()
    limits = ResourceLimits(memory=config.browser_memory, pids=config.browser_pids)
    live, runtime = await _start(browser, local_host, limits)
    try:
        yield live
    finally:
        await live.kill()
        await runtime.aclose()


def test_the_build_shows_its_progress_and_records_what_it_installed(browser: Built) -> None:
    stages = browser.log.splitlines()
    assert "apt-get: configuring packages" in stages
    assert "pip: Successfully installed html-to-markdown-3.19.0" in stages
    assert len(stages) < 100, "progress is condensed to stage lines"
    template = Registry(browser.rootfs.parent.parent).get("browser")
    assert template.metadata["recipe"] == "browser"
    assert {"chromium", "fonts-liberation", "fonts-dejavu-core"} <= set(RECIPES["browser"])
    assert set(RECIPES["browser"]) <= set(template.metadata["packages"])
    assert template.metadata["pypi"] == list(PYPI_RECIPES["browser"])


async def test_chromium_is_debians_from_bookworm_security(sandbox: LiveSandbox) -> None:
    out, code = await run_in_sandbox(sandbox, "sh", "-c", "chromium --version 2>&1")
    assert code == 0 and out.startswith("Chromium 1"), out
    out, code = await run_in_sandbox(
        sandbox, "sh", "-c", "grep -h '^deb ' /etc/apt/sources.list; "
        "dpkg-query -W -f '${Version}' chromium",
    )  # fmt: skip
    sources, version = out.rsplit("\n", 1)
    assert code == 0 and " bookworm-security main" in sources, out
    # Bookworm's security team builds Chromium's updates as ~deb12uN; the point release
    # lags behind them (150.0 in bookworm, 156.0 in bookworm-security on 2026-12-01).
    assert "~deb12u" in version, version


async def test_headless_chromium_renders_a_local_page_to_a_png(sandbox: LiveSandbox) -> None:
    page = base64.b64encode(PAGE.encode()).decode()
    out, code = await run_in_sandbox(
        sandbox, "sh", "-c",
        f"echo {page} | base64 -d > /tmp/page.html && {HEADLESS} --window-size=800,600"
        " --screenshot=/tmp/shot.png file:///tmp/page.html >/tmp/chromium.log 2>&1;"
        " echo $?; base64 -w0 /tmp/shot.png",
    )  # fmt: skip
    status, encoded = out.split("\n", 1)
    assert code == 0 and status == "0", out[-2000:]
    png = base64.b64decode(encoded)
    assert len(png) > 2000, f"a {len(png)}-byte screenshot is no rendered page"
    width, height, pixels = _decode_png(png)
    assert (width, height) == (800, 600)
    red = sum(1 for pixel in pixels if pixel[:3] == (255, 0, 0))
    assert red >= 300 * 200 * 0.95, f"{red} red pixels: the block was not rendered"
    assert red < width * height / 2, "the page's white background was not rendered"


async def test_the_templates_python_converts_html_to_markdown(sandbox: LiveSandbox) -> None:
    script = (
        "from html_to_markdown import convert\n"
        "html = '<h1>Hi</h1><p>a <b>b</b> <a href=\"/x\">l</a></p><pre><code>x = 1</code></pre>'\n"
        "print(convert(html).content, end='')\n"
    )
    out, code = await run_in_sandbox(sandbox, "python3", "-c", script)
    assert code == 0, out
    assert out == "# Hi\n\na **b** [l](/x)\n\n```\nx = 1\n```\n"


async def test_chromium_cannot_start_below_its_thread_count(
    browser: Built, local_host: Host
) -> None:
    """Chromium with one page runs about 113 threads here (docs/templates.md): under 64
    pids it cannot create them and aborts, where the browser limits give it room."""
    live, runtime = await _start(browser, local_host, ResourceLimits(pids=64, memory=1 << 30))
    try:
        out, _ = await run_in_sandbox(
            live, "sh", "-c",
            f"timeout 60 {HEADLESS} --screenshot=/tmp/shot.png about:blank 2>&1; echo rc=$?;"
            " test -e /tmp/shot.png && echo shot",
        )  # fmt: skip
    finally:
        await live.kill()
        await runtime.aclose()
    assert "Resource temporarily unavailable" in out, out[-2000:]
    assert "rc=0" not in out and "shot" not in out.splitlines()[-1], out[-2000:]


def _decode_png(png: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """Width, height and pixels of an 8-bit, non-interlaced RGB or RGBA PNG (what
    Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, data, header = 8, b"", b""
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        at += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            data += body
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    size = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(data), width * size
    rows: list[bytearray] = []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for x in range(stride):
            left = line[x - size] if x >= size else 0
            up, corner = previous[x], previous[x - size] if x >= size else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                guess = left + up - corner
                near = min((abs(guess - left), 0, left), (abs(guess - up), 1, up),
                           (abs(guess - corner), 2, corner))  # fmt: skip
                line[x] = (line[x] + near[2]) & 0xFF
        rows.append(line)
        previous = line
    pixels = [tuple(row[x : x + size]) for row in rows for x in range(0, stride, size)]
    return width, height, pixels
