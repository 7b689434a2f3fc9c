"""Time to interactive through E2B's official SDK against Ringfence, beside the native SDK's.

The script starts a real ``ringfence serve`` on a loopback port (a fresh data directory, its
first admin key; no warm pool unless ``--pool N``) and, in one run, taking turns round by
round, measures from the call that creates a sandbox until the first stdout of ``echo hi``
started in it reaches the caller's ``on_stdout`` callback:

* ``e2b``: ``await e2b.AsyncSandbox.create()`` (``E2B_API_URL``/``E2B_SANDBOX_URL`` at the
  server, its key as ``E2B_API_KEY``), then ``await sbx.commands.run("echo hi",
  on_stdout=...)``;
* ``native``: the same with ``ringfence.client.AsyncSandbox``.

Each sandbox is killed afterwards (timed, not counted). Also reported: the create alone and
the first command alone, per line. This is a report: it never fails on timing. See
bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exec_latency import RunFailed, Stats, at_least, host_facts
from sandbox_latency import Line, Phases, Run, Server, measure, ms, running_server, text

from ringfence.backends.local.probe import bwrap_choice
from ringfence.config import Config

SANDBOX_TIMEOUT = 120  # seconds: a sandbox the script loses track of dies on its own
COMMAND = "echo hi"


Seen = Callable[[str], None]


async def _timed(
    create: Callable[[], Awaitable[Any]], run: Callable[[Any, Seen], Awaitable[Any]]
) -> Phases:
    """Create, run ``echo hi`` until its first stdout reaches the callback, kill."""
    first: list[float] = []
    begun = time.perf_counter()
    sbx = await create()
    created = time.perf_counter() - begun
    try:
        await run(sbx, lambda _: first.append(time.perf_counter() - begun) if not first else None)
    finally:
        before_kill = time.perf_counter()
        await sbx.kill()
        kill = time.perf_counter() - before_kill
    if not first:
        raise RunFailed(f"{COMMAND} printed nothing")
    return {
        "total": first[0],
        "create": created,
        "create -> first stdout": first[0] - created,
        "kill (not counted)": kill,
    }


def e2b_runner() -> Run:
    from e2b import AsyncSandbox, SandboxException

    async def run() -> Phases:
        try:
            return await _timed(
                lambda: AsyncSandbox.create(timeout=SANDBOX_TIMEOUT),
                lambda sbx, seen: sbx.commands.run(COMMAND, on_stdout=seen),
            )
        except SandboxException as exc:
            raise RunFailed(f"{type(exc).__name__}: {exc}") from exc

    return run


def native_runner(server: Server) -> Run:
    from ringfence.client import AsyncSandbox
    from ringfence.errors import RingfenceError

    async def run() -> Phases:
        try:
            return await _timed(
                lambda: AsyncSandbox.create(
                    timeout=SANDBOX_TIMEOUT, url=server.url, api_key=server.key
                ),
                lambda sbx, seen: sbx.commands.run(COMMAND, on_stdout=seen),
            )
        except RingfenceError as exc:
            raise RunFailed(f"{type(exc).__name__}: {exc.message}") from exc

    return run


@dataclass
class Report:
    host: dict[str, str | int]
    pool: int
    sandboxes: int
    lines: list[Line]

    def to_json(self) -> dict[str, Any]:
        lines = {}
        for line in self.lines:
            stats = Stats.of(line.totals)
            phases = {
                phase: ms(Stats.of(samples).median)  # type: ignore[union-attr]
                for phase, samples in line.samples.items()
                if phase != "total" and samples
            }
            lines[line.key] = {
                "name": line.name,
                "command": line.command,
                "n": len(line.totals),
                "p50_ms": ms(stats.median) if stats else None,
                "p90_ms": ms(stats.p90) if stats else None,
                "p99_ms": ms(stats.p99) if stats else None,
                "phases_p50_ms": phases,
                "failure": line.failure,
            }
        return {"host": self.host, "pool": self.pool, "sandboxes": self.sandboxes, "lines": lines}

    def render(self) -> str:
        out = [
            "E2B SDK against Ringfence: time to interactive (create -> first stdout of "
            f"`{COMMAND}`)",
            f"host: {self.host}",
            f"warm pool: {self.pool or 'none (every sandbox starts on demand)'}; "
            f"{self.sandboxes} sandboxes per line",
            "",
            f"{'line':<44} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9}",
        ]
        for line in self.lines:
            stats = Stats.of(line.totals)
            if line.failure:
                out.append(f"{line.name:<44} FAILED: {line.failure}")
                continue
            p50, p90, p99 = (stats.median, stats.p90, stats.p99) if stats else (None, None, None)
            out.append(f"{line.name:<44} {text(p50):>9} {text(p90):>9} {text(p99):>9}")
            for phase, samples in line.samples.items():
                if phase != "total" and samples:
                    median = Stats.of(samples)
                    out.append(f"  {phase:<42} {text(median.median if median else None):>9}")
        e2b, native = (Stats.of(line.totals) for line in self.lines)
        if e2b and native:
            out += [
                "",
                f"E2B SDK p50 / native SDK p50: {e2b.median / native.median:.2f}x",
            ]
        out += ["", "What each line runs:"]
        out += [f"  {line.name.strip()}: {line.command}" for line in self.lines]
        return "\n".join(out)


async def benchmark(args: argparse.Namespace, server: Server) -> Report:
    os.environ.update(E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url, E2B_API_KEY=server.key)
    lines = [
        Line(
            "e2b",
            "e2b SDK (AsyncSandbox)",
            f"await e2b.AsyncSandbox.create(timeout={SANDBOX_TIMEOUT}); await sbx.commands.run("
            f"{COMMAND!r}, on_stdout=...) until the first stdout; e2b " + _version("e2b"),
            e2b_runner(),
        ),
        Line(
            "native",
            "ringfence SDK (ringfence.client.AsyncSandbox)",
            f"the same with ringfence.client.AsyncSandbox.create(timeout={SANDBOX_TIMEOUT})",
            native_runner(server),
        ),
    ]
    await measure(lines, args.sandboxes, args.warmup, "time to interactive")
    host = host_facts(shutil.which(bwrap_choice(Config(backend="local"))))
    return Report(host, args.pool, args.sandboxes, lines)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandboxes", type=at_least(1), default=100, help="per line (100)")
    parser.add_argument("--warmup", type=at_least(0), default=5, help="rounds not counted (5)")
    parser.add_argument(
        "--pool", type=at_least(0), default=0,
        help="warm pool of base sandboxes (RINGFENCE_POOL_SIZES; 0: none)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["RINGFENCE_POOL_SIZES"] = json.dumps({"base": args.pool} if args.pool else {})
    with running_server() as server:
        report = asyncio.run(benchmark(args, server))
    print(report.render())
    if args.json:
        print(json.dumps(report.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
