"""What sandbox metrics cost the server: its CPU time with ``--count`` idle sandboxes,
sampled and scraped, against the same window with nothing asked.

The script starts a real ``ringfence serve`` on a loopback port, creates ``--count`` idle
sandboxes over HTTP, lets them settle, then measures the server process's CPU time
(user + system of every thread, from ``/proc/PID/stat``) over two windows of ``--window``
seconds each, in this order:

1. **off**: nothing asks for any metric (what an idle sandbox costs anyway: nothing is
   sampled in the background unless asked);
2. **on**: every sandbox is asked once for its E2B metrics (``GET /sandboxes/{id}/metrics``,
   which makes the server sample it every 5 s from then on: the most sampling there can
   be) before the window starts, and ``/v1/metrics`` (which reads every sandbox) is
   scraped every ``--scrape-interval`` seconds during it.

The cost is (CPU on - CPU off) / window, in percent of one core; the goal is below 1 %.
Also reported: the latency of one scrape with every sandbox read. Then every sandbox is
killed and the server stopped. A report: it exits 0 whatever it measured (see
bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from exec_latency import at_least, host_facts, progress
from sandbox_density import create_all, kill_all
from sandbox_latency import Server, running_server

GOAL_PERCENT = 1.0  # of one core, with GOAL_COUNT idle sandboxes
GOAL_COUNT = 500
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass
class Report:
    host: dict[str, str | int]
    count: int
    created: int
    window: float
    scrape_interval: float
    off_cpu: float  # seconds of server CPU in the "off" window
    on_cpu: float
    asking_seconds: float  # how long asking every sandbox once took (outside the windows)
    scrapes: int
    scrape_ms_median: float | None
    scrape_ms_max: float | None
    samples_seen: int  # samples the last E2B ask of one sandbox returned (its history)
    kill_failures: list[str]

    @property
    def cost_percent(self) -> float:
        return 100.0 * (self.on_cpu - self.off_cpu) / self.window

    def goal(self) -> tuple[str, str]:
        if self.created < GOAL_COUNT:
            return "NOT RUN", f"{self.created} sandboxes; run with --count {GOAL_COUNT}"
        verdict = "PASS" if self.cost_percent < GOAL_PERCENT else "MISS"
        return verdict, f"{self.cost_percent:.2f} % of one core"

    def render(self) -> str:
        verdict, detail = self.goal()
        host = ", ".join(f"{k} {v}" for k, v in self.host.items())
        return "\n".join([
            f"sandbox metrics: cost of sampling {self.created} idle sandboxes ({host})",
            f"  window                      {self.window:g} s each, off then on",
            f"  server CPU, off             {self.off_cpu:.3f} s "
            f"({100 * self.off_cpu / self.window:.2f} % of a core)",
            f"  server CPU, on              {self.on_cpu:.3f} s "
            f"({100 * self.on_cpu / self.window:.2f} % of a core): every sandbox sampled "
            f"every 5 s, /v1/metrics scraped every {self.scrape_interval:g} s",
            f"  sampling cost               {self.cost_percent:.2f} % of one core",
            f"  one scrape (all read)       median {self.scrape_ms_median or 0:.0f} ms, "
            f"max {self.scrape_ms_max or 0:.0f} ms over {self.scrapes}",
            f"  asking each once            {self.asking_seconds:.1f} s (outside the windows)",
            f"  history of one, at the end  {self.samples_seen} samples",
            f"  goal: < {GOAL_PERCENT:g} % of one core with {GOAL_COUNT} idle sandboxes: "
            f"{verdict} ({detail})",
            f"  kill failures               {len(self.kill_failures)}",
        ])  # fmt: skip


async def ask_each(server: Server, ids: list[str], concurrency: int) -> None:
    """E2B's get_metrics once for each sandbox: from then on the server samples it."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                 headers={"X-API-KEY": server.key}) as e2b:  # fmt: skip

        async def one(sandbox_id: str) -> None:
            async with gate:
                answer = await e2b.get(f"/sandboxes/{sandbox_id}/metrics")
                answer.raise_for_status()

        await asyncio.gather(*(one(i) for i in ids))


async def scrape_during(server: Server, window: float, interval: float) -> list[float]:
    """Scrape /v1/metrics every ``interval`` seconds for ``window``; the latencies."""
    latencies = []
    deadline = time.monotonic() + window
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as plain:
        while True:
            begun = time.perf_counter()
            answer = await plain.get("/v1/metrics")
            answer.raise_for_status()
            latencies.append(time.perf_counter() - begun)
            left = deadline - time.monotonic()
            if left <= 0:
                return latencies
            await asyncio.sleep(min(interval, left))


async def measure(args: argparse.Namespace, server: Server) -> Report:
    async with server.client() as client:
        progress(f"creating {args.count} sandboxes, {args.concurrency} at a time")
        created = await create_all(client, args.count, args.concurrency, args.memory)
        if created.failures:
            progress(f"{len(created.failures)} creates failed, e.g. {created.failures[0]}")
        ids = created.ids
        try:
            await asyncio.sleep(args.settle)
            progress(f"window off: {args.window:g} s, nothing asked")
            before = cpu_seconds(server.pid)
            await asyncio.sleep(args.window)
            off = cpu_seconds(server.pid) - before
            progress("asking each sandbox once for its E2B metrics (it is sampled from then on)")
            begun = time.perf_counter()
            await ask_each(server, ids, args.concurrency)
            asking = time.perf_counter() - begun
            progress(f"window on: {args.window:g} s, scraping every {args.scrape_interval:g} s")
            before = cpu_seconds(server.pid)
            latencies = await scrape_during(server, args.window, args.scrape_interval)
            on = cpu_seconds(server.pid) - before
            seen = 0
            if ids:
                async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                             headers={"X-API-KEY": server.key}) as e2b:  # fmt: skip
                    seen = len((await e2b.get(f"/sandboxes/{ids[0]}/metrics")).json())
        finally:
            progress(f"killing {len(ids)} sandboxes")
            failures = await kill_all(client, ids, args.concurrency)
    ms = [1000 * s for s in latencies]
    return Report(
        host=host_facts(None), count=args.count, created=len(ids), window=args.window,
        scrape_interval=args.scrape_interval, off_cpu=off, on_cpu=on, asking_seconds=asking,
        scrapes=len(ms), scrape_ms_median=statistics.median(ms) if ms else None,
        scrape_ms_max=max(ms) if ms else None, samples_seen=seen, kill_failures=failures,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--count", type=at_least(1), default=GOAL_COUNT,
                        help=f"idle sandboxes ({GOAL_COUNT})")  # fmt: skip
    parser.add_argument("--window", type=float, default=30.0, help="seconds per window (30)")
    parser.add_argument("--scrape-interval", type=float, default=15.0,
                        help="seconds between scrapes (15: Prometheus' default)")  # fmt: skip
    parser.add_argument("--concurrency", type=at_least(1), default=8, help="creates at once (8)")
    parser.add_argument("--memory", default="32M", help="each sandbox's memory limit (32M)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle first (5)")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        progress("run it as root (the local backend's sandboxes need it)")
        return 2
    # Each sandbox's default CPU limit counts against the server's total (32 per core by
    # default): room for --count idle ones, which use none of it.
    os.environ.setdefault("RINGFENCE_MAX_TOTAL_CPUS", str(max(64, 2 * args.count)))
    os.environ.setdefault("RINGFENCE_MAX_SANDBOXES_PER_TENANT", str(max(100, args.count)))
    with running_server() as server:
        report = asyncio.run(measure(args, server))
    print(report.render())
    if args.json:
        print(json.dumps({**asdict(report), "cost_percent": report.cost_percent}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
