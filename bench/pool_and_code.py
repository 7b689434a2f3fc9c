"""Time to interactive from the warm pool, and the ``run_code("1+1")`` round trip, over HTTP.

The script starts a real ``ringfence serve`` on a loopback port with a warm pool of ``--pool``
sandboxes of the ``base`` template (``RINGFENCE_POOL_SIZES``), waits until the pool is full,
and measures in one run:

* time to interactive from the pool: ``POST /v1/sandboxes {}`` (a claim) until the first
  stdout byte of ``echo hi`` started in it; each sandbox is killed after, and the pool is let
  refill before the next round, so that every such create is a hit (checked on
  ``/v1/metrics``). Baseline, taking turns with it: the same create with custom limits,
  which the pool cannot serve (a cold start);
* the ``run_code`` round trip: in one live sandbox, ``POST .../code/execute {"code": "1+1"}``
  until ``end_of_execution``. Baseline, taking turns with it: a local Jupyter kernel
  (``jupyter_client`` + ``ipykernel``, on the host, no sandbox) executing ``1+1`` until its
  ``execute_reply`` and its idle status.

This is a report: it never fails on timing. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from exec_latency import RunFailed, Stats, at_least, host_facts, progress
from sandbox_latency import (
    ECHO,
    Client,
    Line,
    Phases,
    Run,
    Server,
    create_sandbox,
    health_runner,
    kill_sandbox,
    measure,
    ms,
    rpc,
    running_server,
    start_command,
    text,
)

from ringfence.backends.local.probe import bwrap_choice
from ringfence.config import Config

GOAL_POOL_P50_MS = 10.0
GOAL_POOL_P99_MS = 30.0
GOAL_RUN_CODE_P50_MS = 5.0
TEMPLATE = "base"
CODE = "1+1"
EXPECTED = "2"
NO_POOL = {"limits": {"pids": 255}}  # not the default limits: the pool cannot serve it
REFILL_SECONDS = 60.0
POOL_POLL_SECONDS = 0.005
KERNEL_SECONDS = 60.0


# -- the warm pool, as /v1/metrics shows it ------------------------------------------------------


@dataclass(frozen=True)
class PoolState:
    ready: int
    target: int
    hits: int
    misses: int


_METRIC = re.compile(
    r'^ringfence_pool_(ready|target|hits_total|misses_total)\{template="([^"]*)"\} (\d+)$'
)


async def pool_state(client: Client, template: str = TEMPLATE) -> PoolState:
    """The pool of ``template`` from ``GET /v1/metrics``. Raises ``RunFailed`` if it has none."""
    response = await client.get("/v1/metrics")
    if response.status_code != 200:
        raise RunFailed(f"metrics: HTTP {response.status_code}")
    found: dict[str, int] = {}
    for line in response.text.splitlines():
        match = _METRIC.match(line)
        if match and match[2] == template:
            found[match[1]] = int(match[3])
    if len(found) != 4:
        raise RunFailed(f"/v1/metrics shows no warm pool for {template!r}")
    return PoolState(found["ready"], found["target"], found["hits_total"], found["misses_total"])


async def pool_full(client: Client, seconds: float = REFILL_SECONDS) -> PoolState:
    """Poll (with a bound) until the pool holds its target. Raises ``RunFailed`` if it does
    not in ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        state = await pool_state(client)
        if state.ready >= state.target:
            return state
        if time.monotonic() > deadline:
            raise RunFailed(f"the pool did not refill in {seconds:g} s: {state}")
        await asyncio.sleep(POOL_POLL_SECONDS)


@dataclass
class Tally:
    """Claims of one pooled line, as the pool's counters saw them (warm-up rounds included)."""

    hits: int = 0
    misses: int = 0


# -- the lines -----------------------------------------------------------------------------------


def tti_runner(
    client: Client, metrics: Client, spec: dict[str, Any], tally: Tally | None = None
) -> Run:
    """Create a sandbox with ``spec``, run ``echo hi`` until its first stdout byte, kill it.

    With a ``tally`` (a pooled line), then wait until the pool is full again and count whether
    the create was a hit: neither is timed into the line."""

    async def run() -> Phases:
        before = await pool_state(metrics) if tally is not None else None
        begun = time.perf_counter()
        sandbox_id = await create_sandbox(client, **spec)
        created = time.perf_counter() - begun
        try:
            marks = await start_command(client, rpc(sandbox_id), ECHO, begun)
        finally:
            before_kill = time.perf_counter()
            await kill_sandbox(client, sandbox_id)
            kill = time.perf_counter() - before_kill
        if "first_stdout" not in marks:
            raise RunFailed("echo hi printed nothing")
        phases = {
            "total": marks["first_stdout"],
            "create (POST /v1/sandboxes)": created,
            "Start sent -> start event": marks["start_event"] - created,
            "start event -> first stdout": marks["first_stdout"] - marks["start_event"],
            "kill (not counted)": kill,
        }
        if tally is not None and before is not None:
            before_refill = time.perf_counter()
            after = await pool_full(metrics)
            phases["refill (not counted)"] = time.perf_counter() - before_refill
            tally.hits += after.hits - before.hits
            tally.misses += after.misses - before.misses
        return phases

    return run


async def run_code(client: Client, path: str, code: str = CODE) -> tuple[float, str | None]:
    """POST ``code`` to ``path``; seconds until ``end_of_execution``, and the main result's
    text. Raises ``RunFailed`` on an error status, an error line or no end."""
    body = json.dumps({"code": code}).encode()
    headers = {"content-type": "application/json"}
    begun = time.perf_counter()
    result: str | None = None
    async with client.stream("POST", path, headers=headers, content=body) as response:
        if response.status_code != 200:
            raise RunFailed(
                f"run_code: HTTP {response.status_code}: {(await response.aread())[:300]!r}"
            )
        buffer = b""
        async for chunk in response.aiter_bytes():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                if not raw.strip():
                    continue
                line = json.loads(raw)
                kind = line.get("type")
                if kind == "end_of_execution":
                    return time.perf_counter() - begun, result
                if kind == "error":
                    raise RunFailed(f"run_code {code!r}: {line.get('name')}: {line.get('value')}")
                if kind == "result" and line.get("is_main_result"):
                    result = line.get("text")
    raise RunFailed(f"run_code {code!r}: the answer ended without end_of_execution")


def live_echo_runner(client: Client, sandbox_id: str) -> Run:
    """``echo hi`` in a sandbox that has run commands before: what a create adds is the rest."""

    async def run() -> Phases:
        begun = time.perf_counter()
        marks = await start_command(client, rpc(sandbox_id), ECHO, begun)
        if "first_stdout" not in marks:
            raise RunFailed("echo hi printed nothing")
        return {
            "total": marks["first_stdout"],
            "Start sent -> start event": marks["start_event"],
        }

    return run


def run_code_runner(client: Client, path: str) -> Run:
    async def run() -> Phases:
        elapsed, result = await run_code(client, path)
        if result != EXPECTED:
            raise RunFailed(f"run_code {CODE!r} gave {result!r}, not {EXPECTED!r}")
        return {"total": elapsed}

    return run


class JupyterKernel:
    """A local ipykernel (this venv's Python) driven by jupyter_client's blocking client."""

    def __init__(self) -> None:
        from jupyter_client.manager import KernelManager

        self.manager = KernelManager(kernel_name="python3")
        self.client: Any = None
        self.argv: list[str] = []

    def start(self) -> float:
        """Start it; seconds until it answered ``kernel_info``. Raises ``RunFailed``."""
        begun = time.perf_counter()
        self.manager.start_kernel()
        self.argv = list(self.manager.format_kernel_cmd())
        self.client = self.manager.client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=KERNEL_SECONDS)
        except RuntimeError as exc:
            raise RunFailed(f"the Jupyter kernel did not start: {exc}") from exc
        return time.perf_counter() - begun

    def execute(self, code: str) -> tuple[float, str | None]:
        """Seconds from the execute_request until both its ``execute_reply`` and the idle
        status it caused arrived, and the result's text/plain. Raises ``RunFailed``."""
        begun = time.perf_counter()
        msg_id = self.client.execute(code)
        try:
            while True:
                reply = self.client.get_shell_msg(timeout=KERNEL_SECONDS)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            result: str | None = None
            while True:
                message = self.client.get_iopub_msg(timeout=KERNEL_SECONDS)
                if message["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = message["msg_type"], message["content"]
                if kind == "execute_result":
                    result = content["data"].get("text/plain")
                elif kind == "status" and content["execution_state"] == "idle":
                    break
        except queue.Empty as exc:
            raise RunFailed(f"the Jupyter kernel did not answer in {KERNEL_SECONDS:g} s") from exc
        elapsed = time.perf_counter() - begun
        if reply["content"]["status"] != "ok":
            raise RunFailed(f"the Jupyter kernel answered {reply['content']}")
        return elapsed, result

    def close(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)


def jupyter_runner(kernel: JupyterKernel) -> Run:
    """Blocking calls on the loop's thread: nothing else runs during a sequential round."""

    async def run() -> Phases:
        elapsed, result = kernel.execute(CODE)
        if result != EXPECTED:
            raise RunFailed(f"the Jupyter kernel gave {result!r}, not {EXPECTED!r}")
        return {"total": elapsed}

    return run


# -- reporting -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    text: str
    limit_ms: float | None
    measured_ms: float | None

    @property
    def verdict(self) -> str:
        if self.measured_ms is None or self.limit_ms is None:
            return "UNKNOWN"
        return "PASS" if self.measured_ms <= self.limit_ms else "MISS"


@dataclass
class Report:
    host: dict[str, str | int]
    pool_size: int
    sandboxes: int
    runs: int
    warmup: int
    tti: list[Line]
    code: list[Line]
    tallies: dict[str, Tally]
    pool_before: PoolState | None
    pool_after: PoolState | None
    one_offs: dict[str, float] = field(default_factory=dict)  # name -> seconds, not counted
    missing: dict[str, str] = field(default_factory=dict)

    def stats(self, key: str) -> Stats | None:
        line = next((x for x in [*self.tti, *self.code] if x.key == key), None)
        return Stats.of(line.totals) if line is not None else None

    def p50(self, key: str) -> float | None:
        stats = self.stats(key)
        return ms(stats.median) if stats else None

    def p99(self, key: str) -> float | None:
        stats = self.stats(key)
        return ms(stats.p99) if stats else None

    @property
    def goals(self) -> list[Goal]:
        return [
            Goal(
                f"time to interactive from the pool p50 <= {GOAL_POOL_P50_MS:g} ms",
                GOAL_POOL_P50_MS,
                self.p50("pool_tti"),
            ),
            Goal(
                f"time to interactive from the pool p99 <= {GOAL_POOL_P99_MS:g} ms",
                GOAL_POOL_P99_MS,
                self.p99("pool_tti"),
            ),
            Goal(
                f"run_code('1+1') round trip p50 <= {GOAL_RUN_CODE_P50_MS:g} ms",
                GOAL_RUN_CODE_P50_MS,
                self.p50("run_code"),
            ),
            Goal(
                "run_code('1+1') round trip p50 <= the local Jupyter kernel's p50",
                self.p50("jupyter"),
                self.p50("run_code"),
            ),
        ]

    @property
    def pool_check(self) -> str:
        if self.pool_before is None or self.pool_after is None:
            return "pool counters: not read"
        hits = self.pool_after.hits - self.pool_before.hits
        misses = self.pool_after.misses - self.pool_before.misses
        claims = sum(t.hits + t.misses for t in self.tallies.values())
        verdict = "every pooled create was a hit" if hits == claims else "NOT every create hit"
        return (
            f"pool counters (/v1/metrics, warm-up included): {hits} hits for {claims} pooled "
            f"creates ({verdict}); {misses} misses (the no-pool baseline's creates, which "
            f"the pool cannot serve, count as misses: "
            + ", ".join(
                f"{key} {t.hits} hits / {t.misses} misses" for key, t in self.tallies.items()
            )
            + ")"
        )

    def table(self, title: str, lines: Sequence[Line], base: str) -> list[str]:
        floor = self.stats(base)
        out = [title, f"{'name':<44} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'x ' + base:>14}"]
        for line in lines:
            stats = Stats.of(line.totals)
            ratio = "-" if stats is None or floor is None else f"{stats.median / floor.median:.2f}"
            out.append(
                f"{line.name:<44} {text(stats.median if stats else None):>8} "
                f"{text(stats.p99 if stats else None):>8} "
                f"{text(max(line.totals) if line.totals else None):>8} {ratio:>14}"
            )
            if line.failure:
                out.append(f"{'':<44} stopped after {len(line.totals)} runs: {line.failure}")
        return out

    @staticmethod
    def breakdown(lines: Sequence[Line]) -> list[str]:
        out: list[str] = []
        for line in lines:
            phases = [p for p in line.samples if p != "total"]
            if not phases or not line.totals:
                continue
            whole = statistics.median(line.totals)
            out.append(f"  {line.name.strip()}:")
            for phase in phases:
                stats = Stats.of(line.samples[phase])
                if stats is None:
                    continue
                share = "" if "not counted" in phase else f" ({stats.median / whole:.0%})"
                out.append(
                    f"    {phase:<34} p50 {text(stats.median):>8} ms"
                    f"  p99 {text(stats.p99):>8} ms{share}"
                )
        return out

    def render(self) -> str:
        host = ", ".join(f"{k} {v}" for k, v in self.host.items())
        out = [f"host: {host}", ""]
        out += self.table(
            f"Time to interactive: {self.sandboxes} sandboxes per line, one after another, "
            f"pool of {self.pool_size} ({TEMPLATE}) refilled between rounds "
            "(POST /v1/sandboxes -> first stdout byte of `echo hi`)",
            self.tti,
            "no_pool_tti",
        )
        out += ["", "  p50 and p99 of each phase (share of the line's p50):"]
        out += self.breakdown(self.tti)
        out += ["", self.pool_check, ""]
        out += self.table(
            f"run_code round trip: {self.runs} runs of {CODE!r} per line in one live "
            "context (until end_of_execution / execute_reply + idle)",
            self.code,
            "jupyter",
        )
        if self.one_offs:
            out.append("  once, not counted: " + "; ".join(
                f"{name} {seconds * 1000:.1f} ms" for name, seconds in self.one_offs.items()
            ))  # fmt: skip
        for key, reason in self.missing.items():
            out.append(f"{key}: not measured: {reason}")
        out += ["", "what each line is:"]
        out += [f"  {x.name.strip()}: {x.command}" for x in [*self.tti, *self.code]]
        out += ["", "Goals (timings on a shared machine are noisy; a report, not a test):"]
        for goal in self.goals:
            measured = "-" if goal.measured_ms is None else f"{goal.measured_ms:.2f} ms"
            limit = "" if goal.limit_ms is None else f", limit {goal.limit_ms:.2f} ms"
            out.append(f"  {goal.text}: {goal.verdict} (measured {measured}{limit})")
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        def lines(group: Sequence[Line]) -> list[dict[str, Any]]:
            result = []
            for line in group:
                stats = Stats.of(line.totals)
                result.append({
                    "key": line.key,
                    "name": line.name.strip(),
                    "command": line.command,
                    "samples": len(line.totals),
                    "failure": line.failure,
                    "p50_ms": ms(stats.median if stats else None),
                    "p90_ms": ms(stats.p90 if stats else None),
                    "p99_ms": ms(stats.p99 if stats else None),
                    "max_ms": ms(max(line.totals) if line.totals else None),
                    "phases_p50_ms": {
                        phase: ms(statistics.median(values))
                        for phase, values in line.samples.items()
                        if phase != "total"
                    },
                })  # fmt: skip
            return result

        def counters(state: PoolState | None) -> dict[str, int] | None:
            return None if state is None else state.__dict__.copy()

        return {
            "benchmark": "pool_and_code",
            "host": self.host,
            "pool_size": self.pool_size,
            "sandboxes": self.sandboxes,
            "runs": self.runs,
            "warmup": self.warmup,
            "time_to_interactive": lines(self.tti),
            "run_code": lines(self.code),
            "pool_before": counters(self.pool_before),
            "pool_after": counters(self.pool_after),
            "pool_claims": {k: t.__dict__.copy() for k, t in self.tallies.items()},
            "once_ms": {name: ms(seconds) for name, seconds in self.one_offs.items()},
            "not_measured": self.missing,
            "goals": [
                {
                    "goal": g.text,
                    "limit_ms": g.limit_ms,
                    "p50_ms": g.measured_ms,
                    "verdict": g.verdict,
                }
                for g in self.goals
            ],
        }


# -- main ----------------------------------------------------------------------------------------


async def benchmark(args: argparse.Namespace, server: Server) -> Report:
    config = Config(backend="local")
    report = Report(
        host=host_facts(shutil.which(bwrap_choice(config))),
        pool_size=args.pool,
        sandboxes=args.sandboxes,
        runs=args.runs,
        warmup=args.warmup,
        tti=[],
        code=[],
        tallies={"pool_tti": Tally(), "pool_tti_httpx": Tally()},
        pool_before=None,
        pool_after=None,
    )
    async with (
        server.client() as sdk_client,
        server.lean_client() as client,
        server.lean_client() as metrics,
    ):
        progress(f"waiting for the warm pool to hold {args.pool}")
        begun = time.perf_counter()
        await pool_full(metrics)
        report.one_offs["pool filled at start"] = time.perf_counter() - begun
        live_id = await create_sandbox(client)  # a claim: the pool refills below
        report.pool_before = await pool_full(metrics)
        report.tti = [
            Line(
                "pool_tti",
                "ringfence from the warm pool",
                "POST /v1/sandboxes {} (a claim), then POST .../rpc/process.Process/Start of "
                "`echo hi` until its first stdout byte; DELETE afterwards and wait for the pool "
                "to refill (both timed, not counted); a lean HTTP/1.1 client (h11, one "
                "kept-alive connection)",
                tti_runner(client, metrics, {}, report.tallies["pool_tti"]),
            ),
            Line(
                "pool_tti_httpx",
                "  the same through httpx (SDK's client)",
                "the line above with httpx.AsyncClient, the SDK's HTTP client",
                tti_runner(sdk_client, metrics, {}, report.tallies["pool_tti_httpx"]),
            ),
            Line(
                "no_pool_tti",
                "ringfence without the pool (cold start)",
                f"the first line with POST /v1/sandboxes {json.dumps(NO_POOL)}: limits other "
                "than the default ones, which the pool cannot serve, so the sandbox starts then",
                tti_runner(client, metrics, NO_POOL),
            ),
            Line(
                "live_echo",
                "echo hi in a live sandbox (no create)",
                "POST .../rpc/process.Process/Start of `echo hi` until its first stdout byte, "
                "in one sandbox that has run it before: the first line minus this one is "
                "what the create and a sandbox's first command add",
                live_echo_runner(client, live_id),
            ),
            Line(
                "api_health",
                "API round trip, no sandbox",
                "GET /v1/health on the lean client's connection: the floor of any API call",
                health_runner(client),
            ),
        ]
        try:
            await measure(report.tti, args.sandboxes, args.warmup, "time to interactive")
        finally:
            await kill_sandbox(client, live_id)
        report.pool_after = await pool_state(metrics)

        kernel = JupyterKernel()
        sandbox_id = await create_sandbox(client)
        try:
            path = f"/v1/sandboxes/{sandbox_id}/code/execute"
            report.one_offs["first run_code (starts the context)"], _ = await run_code(client, path)
            report.code = [
                Line(
                    "run_code",
                    "ringfence run_code('1+1') (HTTP API)",
                    f"POST /v1/sandboxes/ID/code/execute {{code: {CODE!r}}} until the "
                    "end_of_execution line, in one live context; lean client",
                    run_code_runner(client, path),
                ),
                Line(
                    "run_code_httpx",
                    "  the same through httpx (SDK's client)",
                    "the line above with httpx.AsyncClient, the SDK's HTTP client",
                    run_code_runner(sdk_client, path),
                ),
            ]
            try:
                progress("starting a local Jupyter kernel")
                report.one_offs["Jupyter kernel start"] = kernel.start()
            except (ImportError, RunFailed, OSError) as exc:
                report.missing["jupyter"] = (
                    f"{type(exc).__name__}: {exc} (pip install 'ringfence[bench]')"
                )
            else:
                kernel.execute(CODE)  # its first execute, like the context's, not counted
                report.code.append(
                    Line(
                        "jupyter",
                        "local Jupyter kernel (ipykernel, no sandbox)",
                        f"jupyter_client's blocking client: execute({CODE!r}) until its "
                        "execute_reply and its idle status; ipykernel started with "
                        + " ".join(kernel.argv[:3]),
                        jupyter_runner(kernel),
                    )
                )
            report.code.append(
                Line(
                    "api_health_code",
                    "API round trip, no sandbox",
                    "GET /v1/health on the lean client's connection",
                    health_runner(client),
                )
            )
            await measure(report.code, args.runs, args.warmup, "run_code round trip")
        finally:
            kernel.close()
            await kill_sandbox(client, sandbox_id)
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time to interactive from Ringfence's warm pool (against a cold start) "
        "and the run_code('1+1') round trip (against a local Jupyter kernel), over HTTP. "
        "Exits 0 once it has run: timings are reported, never asserted."
    )
    parser.add_argument(
        "-n",
        "--sandboxes",
        type=at_least(1),
        default=None,
        help="sandboxes created per time-to-interactive line (default 50; 10 with --quick)",
    )
    parser.add_argument(
        "--runs",
        type=at_least(1),
        default=None,
        help="run_code calls per line (default 200; 50 with --quick)",
    )
    parser.add_argument(
        "--pool",
        type=at_least(1),
        default=4,
        help=f"warm sandboxes of {TEMPLATE!r} the server keeps (RINGFENCE_POOL_SIZES; default 4)",
    )
    parser.add_argument(
        "--warmup", type=at_least(0), default=3, help="unmeasured rounds first (default 3)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer runs: a smoke test")
    parser.add_argument(
        "--json", action="store_true", help="also print the results as one line of JSON, last"
    )
    args = parser.parse_args(argv)
    if args.sandboxes is None:
        args.sandboxes = 10 if args.quick else 50
    if args.runs is None:
        args.runs = 50 if args.quick else 200
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import ipykernel  # noqa: F401
        import jupyter_client  # noqa: F401  (the baseline; checked before minutes of work)
    except ImportError as exc:
        sys.exit(
            f"pool_and_code: the Jupyter baseline needs the bench extra ({exc.name} is "
            "missing): .venv/bin/pip install -e '.[dev,bench]'"
        )
    # The server is a child process: it reads its pool from the environment it inherits.
    os.environ["RINGFENCE_POOL_SIZES"] = json.dumps({TEMPLATE: args.pool})
    with running_server() as server:
        try:
            report = asyncio.run(benchmark(args, server))
        except Exception:
            progress(f"the server's log ends with:\n{server.log_tail()}")
            raise
    print(report.render())
    if args.json:
        print(json.dumps(report.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
