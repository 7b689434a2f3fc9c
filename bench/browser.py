"""What the browser sandbox costs: scrapes through Ringfence against the same agent on the host.

The script starts a real ``ringfence serve`` whose templates hold the ``browser`` template,
with a warm pool of one browser sandbox, and a local web server (a page with static text and
a paragraph its script adds at the load event) under ``pages.test``, the one name the
tenant's egress policy allows. The floor is the same browser agent run on the host with no
sandbox (``python -I -B -c "...import sandboxd.browser.__main__" --port N --cdp-port 0
--chromium /usr/bin/chromium``, the sandbox's own command line, with this repository's
``src/ringfence`` on the path), driven the same way: the same JSON body, to its
``/scrape``, over HTTP. In each round, Ringfence and the floor take turns:

* cold scrape: ``POST /v1/sandboxes`` (the browser template, limits the pool cannot serve)
  and its first ``POST .../browser/scrape`` (the daemon starts the agent, the agent starts
  Chromium, the page, its Markdown), until the answer; the floor: the agent started, its
  ``/health``, its first ``/scrape`` (Chromium's start and the page);
* from the warm pool: ``POST /v1/browser/scrape`` (a pooled sandbox, its Chromium started,
  claimed and re-keyed to the tenant's policy, the page, its Markdown; killed afterwards)
  until the answer; the floor: an agent whose Chromium is started (``/start``, not timed),
  its first ``/scrape``; before both, the pool is full again and both Chromiums have idled
  ``SETTLE_SECONDS`` (a Chromium just started is still busy: its first page costs up to
  twice as much, and a refill beside a measurement takes one of the cores);
* a warm session's navigate-and-capture: ``POST .../browser/scrape`` with a URL and
  ``markdown`` and ``screenshot`` on a sandbox whose browser is open; the floor: the same
  body to a warm host agent (after the pool's refill has settled);
* then the warm capture format by format, to show where its time goes inside the agent.

Then PSS per idle browser sandbox (as smem counts it: ``Pss`` of
``/proc/PID/smaps_rollup`` summed over the processes of the sandbox's cgroup, found under
the server's ``ringfence/i<pid>/``): a pooled one (its agent and Chromium on
``about:blank``) and the session's after its page, beside the floor agent's tree.

It prints medians (and p90), each line's ratio to its floor, where the time of a scrape
goes (the agent's own ``elapsed_ms`` inside, the rest outside it), the load average, and
the goals: from the pool, first Markdown p50 <= 1 s; a warm session p50 <= 300 ms; the
sandbox's added cost <= 1.2x the floor; PSS per idle browser sandbox <= 500 MiB. A report:
it never fails on timing. ``--rounds``, ``--warm`` size it; ``--templates-dir`` names the
templates (default: a kept test build under ``$RINGFENCE_TEST_KEEP_TEMPLATES``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from exec_latency import progress
from pool_and_code import pool_state
from sandbox_latency import Server, free_port

PAGES = "pages.test"
CHROMIUM = "/usr/bin/chromium"
MIB = 1 << 20
GOAL_POOL_P50_S = 1.0
GOAL_WARM_P50_S = 0.3
GOAL_RATIO = 1.2
GOAL_PSS_MIB = 500
SETTLE_SECONDS = 3.0  # idleness before the pool's and the warm lines (see measure)
# Not the template's limits (1.5 GiB, 1024 pids): the pool cannot serve these creates, and
# the PSS reading tells the session's cgroup from the pooled one's by its memory limit.
COLD_LIMITS = {"memory": 1600 * MIB}
SCRAPE = {"formats": ["markdown"], "timeout": 60_000}
CAPTURE = {"formats": ["markdown", "screenshot"], "timeout": 60_000}
# Where a warm capture's time goes: the agent's own elapsed_ms by what is asked for.
PROFILE = {
    "links (navigate, load, metadata)": ["links"],
    "markdown (+ firewall, converter)": ["markdown"],
    "screenshot (+ PNG)": ["screenshot"],
    "markdown and screenshot": ["markdown", "screenshot"],
}
PACKAGES = Path(__file__).resolve().parents[1] / "src" / "ringfence"  # holds sandboxd/

PAGE = """<!doctype html><html lang="en"><head><title>Bench page {n}</title>
<meta name="description" content="a local page for bench/browser.py"></head><body><main>
<h1>Release notes {n}</h1><p>Static text: the build is green and the cache is warm.</p>
<ul><li>one</li><li>two</li><li>three</li></ul><pre><code>print("hello")</code></pre>
<div id="app"></div><script>
window.addEventListener("load", () => {{
  document.getElementById("app").innerHTML = "<p>Rendered by script</p>";
}});
</script></main></body></html>"""


# -- the local page -----------------------------------------------------------------------------


@contextlib.contextmanager
def page_server() -> Iterator[int]:
    """A web server on 127.0.0.1 answering every path with PAGE; its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = PAGE.format(n=self.path.rsplit("=", 1)[-1]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


# -- the floor: the agent on the host -----------------------------------------------------------


class HostAgent:
    """The browser agent as a host process with its own HOME; ``client`` speaks to it."""

    def __init__(self, home: Path) -> None:
        self.port = free_port()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
        # The sandbox's own command line (``-I -B -c``, the package's directory on the
        # path), not ``-m ringfence.sandboxd.browser``, which imports ``ringfence`` first
        # (the SDK: about 1 s more here). This venv's python: it has the converter.
        boot = (
            f"import sys; sys.path.insert(0, {str(PACKAGES)!r}); import sandboxd.browser.__main__"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", boot, "--port", str(self.port),
             "--cdp-port", "0", "--chromium", CHROMIUM],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=120)

    async def healthy(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await self.client.get("/health")).status_code == 200:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the host agent did not start")
            await asyncio.sleep(0.01)

    async def scrape(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = await self.client.post("/scrape", json=body)
        if answer.status_code != 200:
            raise RuntimeError(f"host agent: {answer.status_code} {answer.text[:300]}")
        result: dict[str, Any] = answer.json()
        return result

    async def stop(self) -> None:
        await self.client.aclose()
        self.process.terminate()
        try:
            await asyncio.to_thread(self.process.wait, 20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            await asyncio.to_thread(self.process.wait, 10)


@contextlib.asynccontextmanager
async def host_agent(home: Path) -> AsyncIterator[HostAgent]:
    agent = HostAgent(home)
    try:
        await agent.healthy()
        yield agent
    finally:
        await agent.stop()


# -- PSS ----------------------------------------------------------------------------------------


def pss_of(pids: list[int]) -> int:
    """Bytes of PSS summed over ``pids`` (those gone meanwhile count nothing)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    return total


def tree_of(root: int) -> list[int]:
    """``root`` and its descendants (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            text = status.read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(status.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def sandbox_cgroups(server_pid: int) -> dict[Path, int]:
    """The memory cgroups of the server's sandboxes and each one's memory limit."""
    found: dict[Path, int] = {}
    for line in Path(f"/proc/{server_pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "memory":
            for group in Path(f"/sys/fs/cgroup/memory{path}").glob(f"ringfence/i{server_pid}/rf-*"):
                found[group] = int((group / "memory.limit_in_bytes").read_text())
        elif controllers == "" and not found:
            unified = Path(f"/sys/fs/cgroup/unified{path}")
            for group in unified.glob(f"**/ringfence/i{server_pid}/rf-*"):
                limit = (group / "memory.max").read_text().strip()
                found[group] = int(limit) if limit != "max" else 0
    return found


def cgroup_pids(group: Path) -> list[int]:
    return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]


# -- the run ------------------------------------------------------------------------------------


@dataclass
class Line:
    """One measured line: client-side seconds, and the agent's own ``elapsed_ms``."""

    seconds: list[float] = field(default_factory=list)
    inside: list[float] = field(default_factory=list)

    def add(self, seconds: float, result: dict[str, Any]) -> None:
        if not result.get("markdown"):
            raise RuntimeError(f"no Markdown in the answer: {str(result)[:300]}")
        self.seconds.append(seconds)
        self.inside.append(float(result.get("elapsed_ms") or 0) / 1000)


def p(samples: list[float], q: float) -> float:
    if len(samples) < 2:
        return samples[0] if samples else float("nan")
    if q == 0.5:
        return statistics.median(samples)
    return statistics.quantiles(samples, n=10, method="inclusive")[int(q * 10) - 1]


async def timed(coro: Any) -> tuple[float, Any]:
    begun = time.perf_counter()
    result = await coro
    return time.perf_counter() - begun, result


async def ok_json(response: Any) -> dict[str, Any]:
    answer = await response
    if answer.status_code not in (200, 201):
        raise RuntimeError(f"{answer.request.url.path}: {answer.status_code} {answer.text[:300]}")
    result: dict[str, Any] = answer.json()
    return result


def default_templates() -> Path | None:
    kept = os.environ.get("RINGFENCE_TEST_KEEP_TEMPLATES")
    if not kept:
        return None
    built = sorted(Path(kept).glob("browser-*/ringfence-templates"))
    return built[-1] if built else None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warm", type=int, default=8, help="warm captures per round each")
    parser.add_argument("--templates-dir", type=Path, default=default_templates())
    args = parser.parse_args()
    if args.templates_dir is None or not (args.templates_dir / "browser").is_dir():
        sys.exit("no browser template: pass --templates-dir (ringfence template build browser)")
    if not os.access(CHROMIUM, os.X_OK):
        sys.exit(f"{CHROMIUM} is missing (the floor runs the agent on the host)")
    with page_server() as port, tempfile.TemporaryDirectory(prefix="rf-bench-") as workdir:
        policy = {"rules": [{"domain": PAGES, "cidr": "127.0.0.1/32", "ports": [port]}]}
        os.environ.update({
            "RINGFENCE_TEMPLATES_DIR": str(args.templates_dir),
            "RINGFENCE_NETWORK_HOSTS": json.dumps({PAGES: ["127.0.0.1"]}),
            "RINGFENCE_NETWORK_INTERNAL_CIDRS": '["127.0.0.1/32"]',
            "RINGFENCE_NETWORK_DEFAULTS": json.dumps({"default": policy}),
            "RINGFENCE_POOL_SIZES": '{"base": 0, "browser": 1}',
        })  # fmt: skip
        server = Server(Path(workdir))
        progress(f"starting ringfence serve on {server.url}")
        server.start()
        try:
            report = await measure(server, port, policy, Path(workdir), args)
        finally:
            server.stop()
    print_report(report, args)


@dataclass
class Report:
    lines: dict[str, Line]
    create: list[float]
    floor_start: list[float]
    profile: dict[str, tuple[list[float], list[float]]]
    pss: dict[str, int]
    usage: dict[str, int]
    load: str


async def measure(
    server: Server, port: int, policy: dict[str, Any], workdir: Path, args: argparse.Namespace
) -> Report:
    url = f"http://{PAGES}:{port}/page?n="
    lines = {name: Line() for name in
             ("cold", "cold floor", "pool", "pool floor", "warm", "warm floor")}  # fmt: skip
    create: list[float] = []
    floor_start: list[float] = []
    profile: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in PROFILE}
    counter = iter(range(1 << 30))
    async with server.client(timeout=180) as api:
        progress("waiting for the warm pool")
        await _pool_full(api)
        session = await ok_json(api.post("/v1/sandboxes", json={
            "template": "browser", "network": policy, "limits": COLD_LIMITS, "timeout": 3600,
        }))  # fmt: skip
        scrape_path = f"/v1/sandboxes/{session['id']}/browser/scrape"
        await ok_json(api.post(scrape_path, json={"url": url + "0", **SCRAPE}))
        async with host_agent(workdir / "warm-home") as warm:
            await warm.scrape({"url": url + "0", **SCRAPE})
            for round_ in range(args.rounds):
                progress(f"round {round_ + 1}/{args.rounds}")
                # cold, sandboxed: create, then the first scrape
                begun = time.perf_counter()
                created = await ok_json(api.post("/v1/sandboxes", json={
                    "template": "browser", "network": policy, "limits": COLD_LIMITS,
                    "timeout": 600,
                }))  # fmt: skip
                create.append(time.perf_counter() - begun)
                result = await ok_json(api.post(
                    f"/v1/sandboxes/{created['id']}/browser/scrape",
                    json={"url": url + str(next(counter)), **SCRAPE},
                ))  # fmt: skip
                lines["cold"].add(time.perf_counter() - begun, result)
                await api.delete(f"/v1/sandboxes/{created['id']}")
                # cold, the floor: the agent's start, Chromium's, the page
                begun = time.perf_counter()
                async with host_agent(workdir / f"cold-{round_}") as agent:
                    floor_start.append(time.perf_counter() - begun)
                    result = await agent.scrape({"url": url + str(next(counter)), **SCRAPE})
                    lines["cold floor"].add(time.perf_counter() - begun, result)
                # from the pool: both Chromiums idle SETTLE_SECONDS first (one just started
                # is still busy with its own start-up: its first page costs up to twice
                # as much, and a refill starting beside a measurement takes a core)
                async with host_agent(workdir / f"pool-{round_}") as agent:
                    await agent.client.post("/start")
                    await _settled(api)
                    seconds, result = await timed(ok_json(api.post(
                        "/v1/browser/scrape", json={"url": url + str(next(counter)), **SCRAPE}
                    )))  # fmt: skip
                    lines["pool"].add(seconds, result)
                    seconds, result = await timed(
                        agent.scrape({"url": url + str(next(counter)), **SCRAPE})
                    )
                    lines["pool floor"].add(seconds, result)
                # a warm session, taking turns, once the pool's refill is over
                await _settled(api)
                for _ in range(args.warm):
                    body = {"url": url + str(next(counter)), **CAPTURE}
                    seconds, result = await timed(ok_json(api.post(scrape_path, json=body)))
                    lines["warm"].add(seconds, result)
                    seconds, result = await timed(warm.scrape(body))
                    lines["warm floor"].add(seconds, result)
            progress("the warm capture, format by format")
            for _ in range(args.warm):
                for name, formats in PROFILE.items():
                    body = {"url": url + str(next(counter)), "formats": formats, "timeout": 60_000}
                    ours = await ok_json(api.post(scrape_path, json=body))
                    theirs = await warm.scrape(body)
                    profile[name][0].append(float(ours["elapsed_ms"]) / 1000)
                    profile[name][1].append(float(theirs["elapsed_ms"]) / 1000)
            await _settled(api)  # idle: what Chromium holds once its page settled
            pss, usage = idle_memory(server.pid, warm.process.pid)
        await api.delete(f"/v1/sandboxes/{session['id']}")
    load = Path("/proc/loadavg").read_text().split()[:3]
    return Report(lines, create, floor_start, profile, pss, usage, " ".join(load))


async def _settled(api: httpx.AsyncClient) -> None:
    """The pool full again, and SETTLE_SECONDS of idleness for what was just started."""
    await _pool_full(api)
    await asyncio.sleep(SETTLE_SECONDS)


async def _pool_full(api: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 180
    while (state := await pool_state(api, "browser")).ready < state.target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the browser pool did not fill: {state}")
        await asyncio.sleep(0.05)


def idle_memory(server_pid: int, floor_pid: int) -> tuple[dict[str, int], dict[str, int]]:
    """PSS (and the cgroup's own memory usage) of the idle pooled sandbox, the idle session
    sandbox and the floor agent's process tree."""
    pss: dict[str, int] = {"floor agent (host)": pss_of(tree_of(floor_pid))}
    usage: dict[str, int] = {}
    for group, limit in sandbox_cgroups(server_pid).items():
        name = "session sandbox" if limit == COLD_LIMITS["memory"] else "pooled sandbox"
        pss[name] = pss_of(cgroup_pids(group))
        with contextlib.suppress(OSError):
            usage[name] = int((group / "memory.usage_in_bytes").read_text())
    return pss, usage


def print_report(report: Report, args: argparse.Namespace) -> None:
    lines = report.lines
    n = len(lines["warm"].seconds)
    print(
        f"browser scrapes, {args.rounds} rounds ({n} warm captures each side), load {report.load}"
    )
    print("  line                                  p50 ms    p90 ms   inside p50   x floor")
    for name, line in lines.items():
        floor = lines.get(f"{name} floor")
        ratio = f"{p(line.seconds, 0.5) / p(floor.seconds, 0.5):6.2f}x" if floor else ""
        print(
            f"  {name:36} {p(line.seconds, 0.5) * 1000:8.0f} {p(line.seconds, 0.9) * 1000:9.0f}"
            f" {p(line.inside, 0.5) * 1000:10.0f}   {ratio}"
        )
    print(f"  cold: the create alone p50 {p(report.create, 0.5) * 1000:.0f} ms; the floor's"
          f" agent start to /health p50 {p(report.floor_start, 0.5) * 1000:.0f} ms")  # fmt: skip
    for name in ("cold", "pool", "warm"):
        line = lines[name]
        outside = [s - i for s, i in zip(line.seconds, line.inside, strict=True)]
        print(f"  {name}: outside the agent p50 {p(outside, 0.5) * 1000:.0f} ms "
              f"(the agent's own time {p(line.inside, 0.5) * 1000:.0f} ms)")  # fmt: skip
    print("a warm capture inside the agent, by format (p50 ms: sandbox / floor):")
    for name, (ours, theirs) in report.profile.items():
        print(f"  {name:36} {p(ours, 0.5) * 1000:6.0f} / {p(theirs, 0.5) * 1000:6.0f}")
    print("idle memory (PSS summed over the processes; the cgroup's usage in brackets):")
    for name, value in report.pss.items():
        used = f" [{report.usage[name] / MIB:.0f} MiB]" if name in report.usage else ""
        print(f"  {name:24} {value / MIB:7.0f} MiB{used}")
    print("goals:")
    pool = p(lines["pool"].seconds, 0.5)
    warm = p(lines["warm"].seconds, 0.5)
    verdicts = [
        (f"from the pool, first Markdown p50 <= {GOAL_POOL_P50_S:g} s", pool <= GOAL_POOL_P50_S,
         f"{pool * 1000:.0f} ms"),
        (f"a warm session p50 <= {GOAL_WARM_P50_S * 1000:.0f} ms", warm <= GOAL_WARM_P50_S,
         f"{warm * 1000:.0f} ms"),
    ]  # fmt: skip
    for name in ("cold", "pool", "warm"):
        ratio = p(lines[name].seconds, 0.5) / p(lines[f"{name} floor"].seconds, 0.5)
        verdicts.append((f"{name}: the sandbox's cost <= {GOAL_RATIO:g}x the floor",
                         ratio <= GOAL_RATIO, f"{ratio:.2f}x"))  # fmt: skip
    for name, value in report.pss.items():
        if "sandbox" in name:
            verdicts.append((f"PSS of an idle {name} <= {GOAL_PSS_MIB} MiB",
                             value <= GOAL_PSS_MIB * MIB, f"{value / MIB:.0f} MiB"))  # fmt: skip
    for goal, held, value in verdicts:
        print(f"  {goal:52} {value:>9}  {'holds' if held else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
