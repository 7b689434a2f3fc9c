"""How long one isolated execution takes through Ringfence, next to its floor and its peers.

One run measures:

* latency: the wall time of running ``/bin/true`` once, sequentially, through Ringfence's
  Python API with full isolation (``LocalExecutor``: namespaces + seccomp + cgroups), through
  raw bubblewrap started with ``subprocess.run`` (the floor), and through reference lines: a
  plain ``/bin/true`` subprocess, bubblewrap shaped like Ringfence's sandbox, and docker,
  podman and gVisor's ``runsc`` where they are installed and work here;
* throughput: executions per second with a fixed number running at once, through Ringfence
  and, for reference, through raw bubblewrap.

Contenders take turns within every iteration (latency) or alternate in blocks (throughput),
so drift of the machine affects them alike. This is a report: it never fails on timing, and
a contender that is missing or broken on this host is listed as "not available" with the
reason. It starts no daemon. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ringfence.backends import Executor, create_executor
from ringfence.backends.local.probe import bwrap_choice
from ringfence.config import Config
from ringfence.errors import RingfenceError
from ringfence.models import ExecutionRequest, Status

TRUE = "/bin/true"
DEFAULT_IMAGE = "ringfence-bench-busybox:latest"
RINGFENCE_NAME = "ringfence (LocalExecutor)"
RAW_BWRAP_NAME = "raw bwrap (floor)"
PEER_NAMES = (("docker", "docker run"), ("podman", "podman run"), ("runsc", "runsc do (gVisor)"))

GOAL_MAX_RATIO = 2.0  # Ringfence's median latency at most this many times raw bwrap's
GOAL_MIN_PER_SECOND = 100.0  # isolated executions per second, on this machine

RUN_TIMEOUT = 60.0  # seconds one execution of any contender may take before it counts as failed
PROBE_TIMEOUT = 60.0  # the first container start of an engine can be slow
QUERY_TIMEOUT = 15.0  # "is the daemon there", "is the image there"
THROUGHPUT_BLOCKS = 4

# Flags tried, in order, after the plain ``podman run`` fails. Each is a known host quirk:
# crun refuses hybrid cgroup hierarchies (v1 controllers plus a cgroup2 mount), and without
# CAP_SYS_RESOURCE the default rlimits podman sets (above the host's hard limits) are refused.
PODMAN_FALLBACK_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--runtime", "runc"),
    ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"),
    ("--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"),
)
# ``runsc do`` variants, in order: it refuses to share the host's network namespace, and only
# some platforms work on a given host (Debian's build works with ptrace; kvm may hang in a VM).
RUNSC_VARIANTS: tuple[tuple[str, ...], ...] = (
    ("runsc", "do", TRUE),
    ("runsc", "--network=none", "do", TRUE),
    ("runsc", "--platform=ptrace", "--network=none", "do", TRUE),
    ("runsc", "--rootless", "--network=none", "do", TRUE),
)

Run = Callable[[], Awaitable[None]]
"""One execution of ``/bin/true`` by a contender; raises ``RunFailed`` unless it succeeded."""


class RunFailed(Exception):
    """One execution did not succeed."""


class NotAvailable(Exception):
    """A contender is not installed or does not work on this host; the message says why."""


# -- running commands ---------------------------------------------------------------------------


def run_command(argv: Sequence[str], timeout: float = RUN_TIMEOUT) -> None:
    """Run ``argv`` to completion. Raises ``RunFailed`` unless it exits with status 0."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RunFailed(f"timed out after {timeout:g} s") from None
    except OSError as exc:
        raise RunFailed(str(exc)) from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        why = lines[-1][:300] if lines else "no message"
        raise RunFailed(f"exit status {done.returncode}: {why}")


def blocking_runner(argv: Sequence[str]) -> Run:
    """A ``Run`` that calls ``subprocess.run`` on the event loop's thread.

    Blocking the loop is deliberate: during the sequential latency measurement nothing else
    runs on it, and this is the cheapest way Python has to start a process: the floor.
    """

    async def run() -> None:
        run_command(argv)

    return run


def threaded_runner(argv: Sequence[str], pool: ThreadPoolExecutor) -> Run:
    """A ``Run`` that calls ``subprocess.run`` on ``pool``, so several can run at once."""

    async def run() -> None:
        await asyncio.get_running_loop().run_in_executor(pool, run_command, argv)

    return run


def ringfence_runner(executor: Executor) -> Run:
    """A ``Run`` through Ringfence's public API, building the request as a caller would."""

    async def run() -> None:
        try:
            result = await executor.execute(ExecutionRequest(command=[TRUE]))
        except Exception as exc:  # a report, not a test: an error ends this contender only
            raise RunFailed(f"{type(exc).__name__}: {exc}") from exc
        if result.status is not Status.SUCCEEDED:
            raise RunFailed(f"{result.status.value}: {result.error or result.logs[-300:]}")

    return run


# -- the contenders -----------------------------------------------------------------------------


@dataclass
class Contender:
    """Something that runs ``/bin/true``, and what its runs measured."""

    key: str  # stable identifier, for the JSON output
    name: str  # label in the table
    command: str  # what one execution is, in words or as a shell command line
    run: Run
    samples: list[float] = field(default_factory=list)  # seconds, warm-up excluded
    failure: str | None = None  # set when an execution failed; it is then measured no further


@dataclass(frozen=True)
class Missing:
    """A contender that is not available on this host."""

    key: str
    name: str
    reason: str


def raw_bwrap_argv(bwrap: str) -> list[str]:
    """The floor: the least a bubblewrap sandbox with every namespace costs."""
    return [bwrap, "--unshare-all", "--ro-bind", "/", "/", TRUE]


def ringfence_shaped_bwrap_argv(bwrap: str) -> list[str]:
    """bubblewrap with the namespaces and the kind of root Ringfence builds (a tmpfs root, the
    host's system directories bound read-only, fresh /proc and /dev, tmpfs /tmp and workspace),
    but without its seccomp filter, cgroup, privilege drop and Python supervision."""
    argv = [
        bwrap,
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
        "--unshare-uts", "--unshare-cgroup", "--disable-userns",
        "--die-with-parent", "--new-session",
        "--uid", "1000", "--gid", "1000", "--hostname", "sandbox",
        "--tmpfs", "/",
    ]  # fmt: skip
    for top in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc"):
        path = "/" + top
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return [
        *argv,
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--tmpfs", "/tmp", "--tmpfs", "/home/user", "--chdir", "/home/user",
        "--remount-ro", "/",
        TRUE,
    ]  # fmt: skip


def check_query(argv: Sequence[str], reason: str) -> None:
    """Raises ``NotAvailable(reason: ...)`` unless ``argv`` succeeds."""
    try:
        run_command(argv, timeout=QUERY_TIMEOUT)
    except RunFailed as exc:
        raise NotAvailable(f"{reason} ({shlex.join(argv)}: {exc})") from None


def first_working(variants: Sequence[Sequence[str]]) -> list[str]:
    """Run each command line once, in order; return the first that succeeds.

    Raises:
        NotAvailable: none succeeded; says why the first (the canonical one) failed.
    """
    failures: list[str] = []
    for argv in variants:
        try:
            run_command(argv, timeout=PROBE_TIMEOUT)
        except RunFailed as exc:
            failures.append(f"{shlex.join(argv)}: {exc}")
            continue
        return list(argv)
    others = len(failures) - 1
    suffix = f" (and {others} variant(s) with other flags failed too)" if others else ""
    raise NotAvailable(failures[0] + suffix)


def require_program(program: str) -> None:
    if shutil.which(program) is None:
        raise NotAvailable(f"{program} is not installed")


def docker_argv(image: str) -> list[str]:
    require_program("docker")
    check_query(["docker", "version", "--format", "{{.Server.Version}}"], "no docker daemon")
    check_query(["docker", "image", "inspect", image], f"no image {image}: see bench/README.md")
    return first_working([["docker", "run", "--rm", "--network", "none", image, TRUE]])


def podman_argv(image: str) -> list[str]:
    require_program("podman")
    check_query(["podman", "image", "exists", image], f"no image {image}: see bench/README.md")
    base = ["podman", "run", "--rm", "--network", "none"]
    flag_sets: list[Sequence[str]] = [(), *PODMAN_FALLBACK_FLAGS]
    return first_working([[*base, *flags, image, TRUE] for flags in flag_sets])


def runsc_argv() -> list[str]:
    require_program("runsc")
    return first_working(RUNSC_VARIANTS)


def peers(image: str) -> tuple[list[Contender], list[Missing]]:
    """Probe docker, podman and runsc with a real run each; return those that work."""
    found: list[Contender] = []
    missing: list[Missing] = []
    probes: dict[str, Callable[[], list[str]]] = {
        "docker": lambda: docker_argv(image),
        "podman": lambda: podman_argv(image),
        "runsc": runsc_argv,
    }
    for key, name in PEER_NAMES:
        probe = probes[key]
        progress(f"probing {key}")
        try:
            argv = probe()
        except NotAvailable as exc:
            missing.append(Missing(key, name, str(exc)))
            continue
        found.append(Contender(key, name, shlex.join(argv), blocking_runner(argv)))
    return found, missing


# -- measuring ----------------------------------------------------------------------------------


async def measure_latency(contenders: Sequence[Contender], iterations: int, warmup: int) -> None:
    """Time one run of every contender per iteration, rotating who goes first."""
    rounds = warmup + iterations
    step = max(1, rounds // 10)
    for i in range(rounds):
        shift = i % len(contenders)
        for contender in [*contenders[shift:], *contenders[:shift]]:
            if contender.failure is not None:
                continue
            start = time.perf_counter()
            try:
                await contender.run()
            except RunFailed as exc:
                contender.failure = f"run {i + 1} failed: {exc}"
                continue
            elapsed = time.perf_counter() - start
            if i >= warmup:
                contender.samples.append(elapsed)
        if (i + 1) % step == 0 or i + 1 == rounds:
            progress(f"latency: {i + 1}/{rounds} rounds ({warmup} warm-up)")


@dataclass
class Throughput:
    """Executions of one contender run ``concurrency`` at a time, over all its blocks."""

    key: str
    name: str
    command: str
    run: Run
    succeeded: int = 0
    failed: int = 0
    first_failure: str | None = None
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.succeeded / self.seconds if self.seconds > 0 else 0.0

    @property
    def median_latency(self) -> float | None:
        return statistics.median(self.latencies) if self.latencies else None


async def run_block(tally: Throughput, count: int, concurrency: int) -> None:
    """Run ``count`` executions, at most ``concurrency`` at once, and add them to ``tally``."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            start = time.perf_counter()
            try:
                await tally.run()
            except RunFailed as exc:
                tally.failed += 1
                tally.first_failure = tally.first_failure or str(exc)
                return
            tally.latencies.append(time.perf_counter() - start)
            tally.succeeded += 1

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    tally.seconds += time.perf_counter() - start


async def measure_throughput(tallies: Sequence[Throughput], total: int, concurrency: int) -> None:
    """Run ``total`` executions per contender in blocks, alternating which contender goes first."""
    blocks = min(THROUGHPUT_BLOCKS, total)
    sizes = [total // blocks + (1 if b < total % blocks else 0) for b in range(blocks)]
    for b, size in enumerate(sizes):
        order = tallies if b % 2 == 0 else list(reversed(tallies))
        for tally in order:
            await run_block(tally, size, concurrency)
        progress(f"throughput: block {b + 1}/{blocks}")


# -- reporting ----------------------------------------------------------------------------------


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Stats:
    """Summary of latency samples, in seconds."""

    median: float
    p90: float
    p99: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats | None:
        if not samples:
            return None
        if len(samples) == 1:
            return cls(samples[0], samples[0], samples[0])
        cuts = statistics.quantiles(samples, n=100, method="inclusive")
        return cls(statistics.median(samples), cuts[89], cuts[98])


def summary(stats: Stats | None) -> tuple[float | None, float | None, float | None]:
    """Median, p90 and p99, or three Nones."""
    return (None, None, None) if stats is None else (stats.median, stats.p90, stats.p99)


@dataclass(frozen=True)
class Goal:
    text: str
    holds: bool | None  # None: not measured, so not judged
    detail: str


def judge_goals(
    ringfence: Stats | None, floor: Stats | None, rate: Throughput | None, cpus: int
) -> list[Goal]:
    ratio_text = f"Ringfence median at most {GOAL_MAX_RATIO:g}x raw bwrap"
    if ringfence is None or floor is None:
        ratio_goal = Goal(ratio_text, None, "not measured")
    else:
        times = ringfence.median / floor.median
        detail = f"{times:.2f}x: {_ms(ringfence.median)} ms vs {_ms(floor.median)} ms"
        ratio_goal = Goal(ratio_text, times <= GOAL_MAX_RATIO, detail)
    rate_text = f"at least {GOAL_MIN_PER_SECOND:g} isolated executions per second on 2 cores"
    if rate is None or rate.succeeded == 0:
        rate_goal = Goal(rate_text, None, "not measured")
    else:
        detail = f"{rate.per_second:.1f}/s on this machine's {cpus} CPU(s)"
        rate_goal = Goal(rate_text, rate.per_second >= GOAL_MIN_PER_SECOND, detail)
    return [ratio_goal, rate_goal]


@dataclass(frozen=True)
class Report:
    host: dict[str, str | int]
    iterations: int
    warmup: int
    concurrency: int
    throughput_executions: int
    contenders: Sequence[Contender]
    missing: Sequence[Missing]
    throughput: Sequence[Throughput]

    def stats(self, key: str) -> Stats | None:
        return next((Stats.of(c.samples) for c in self.contenders if c.key == key), None)

    def throughput_of(self, key: str) -> Throughput | None:
        return next((t for t in self.throughput if t.key == key), None)

    @property
    def goals(self) -> list[Goal]:
        cpus = int(self.host["cpus"])
        return judge_goals(
            self.stats("ringfence"), self.stats("raw_bwrap"), self.throughput_of("ringfence"), cpus
        )

    def ratio(self, stats: Stats | None) -> float | None:
        floor = self.stats("raw_bwrap")
        return None if stats is None or floor is None else stats.median / floor.median

    def render(self) -> str:
        host = ", ".join(f"{k} {v}" for k, v in self.host.items())
        lines = [
            f"Latency of one {TRUE}, sequential: {self.iterations} iterations after "
            f"{self.warmup} warm-up, contenders taking turns",
            f"host: {host}",
            "",
            f"{'name':<34} {'median ms':>10} {'p90 ms':>9} {'p99 ms':>9} {'x raw bwrap':>12}",
        ]
        for c in self.contenders:
            stats = Stats.of(c.samples)
            ratio = self.ratio(stats)
            median, p90, p99 = (_ms(value) for value in summary(stats))
            times = "-" if ratio is None else f"{ratio:.2f}"
            lines.append(f"{c.name:<34} {median:>10} {p90:>9} {p99:>9} {times:>12}")
            if c.failure is not None:
                lines.append(f"{'':<34} stopped after {len(c.samples)} samples: {c.failure}")
        for m in self.missing:
            reason = m.reason.replace("\n", "\n" + " " * 38)
            lines.append(f"{m.name:<34} not available: {reason}")
        lines += ["", "what each line runs:"]
        lines += [f"  {c.name}: {c.command}" for c in self.contenders]
        if self.throughput:
            lines += [
                "",
                f"Throughput: {self.throughput_executions} executions each, {self.concurrency} "
                f"at a time, in {min(THROUGHPUT_BLOCKS, self.throughput_executions)} "
                "alternating blocks",
                f"{'name':<34} {'exec/s':>10} {'median ms':>10} {'failed':>7}",
            ]
            for t in self.throughput:
                lines.append(
                    f"{t.name:<34} {t.per_second:>10.1f} {_ms(t.median_latency):>10} {t.failed:>7}"
                )
                if t.first_failure is not None:
                    lines.append(f"{'':<34} first failure: {t.first_failure}")
        lines += ["", "Goals (a report, not a test: timings on a shared machine are noisy):"]
        for g in self.goals:
            verdict = {True: "holds", False: "DOES NOT HOLD", None: "unknown"}[g.holds]
            lines.append(f"  {g.text}: {verdict} ({g.detail})")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        latency: list[dict[str, Any]] = []
        for c in self.contenders:
            stats = Stats.of(c.samples)
            ratio = self.ratio(stats)
            median, p90, p99 = (_ms_number(value) for value in summary(stats))
            latency.append({
                "key": c.key,
                "name": c.name,
                "command": c.command,
                "available": True,
                "failure": c.failure,
                "samples": len(c.samples),
                "median_ms": median,
                "p90_ms": p90,
                "p99_ms": p99,
                "ratio_to_raw_bwrap": None if ratio is None else round(ratio, 3),
            })  # fmt: skip
        latency += [
            {"key": m.key, "name": m.name, "available": False, "reason": m.reason}
            for m in self.missing
        ]
        throughput = [
            {
                "key": t.key,
                "name": t.name,
                "command": t.command,
                "succeeded": t.succeeded,
                "failed": t.failed,
                "first_failure": t.first_failure,
                "seconds": round(t.seconds, 4),
                "per_second": round(t.per_second, 1),
                "median_ms_under_load": _ms_number(t.median_latency),
            }
            for t in self.throughput
        ]
        return {
            "benchmark": "exec_latency",
            "command": TRUE,
            "host": self.host,
            "iterations": self.iterations,
            "warmup": self.warmup,
            "concurrency": self.concurrency,
            "throughput_executions": self.throughput_executions,
            "latency": latency,
            "throughput": throughput,
            "goals": [{"goal": g.text, "holds": g.holds, "detail": g.detail} for g in self.goals],
        }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def _ms_number(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def host_facts(bwrap: str | None) -> dict[str, str | int]:
    facts: dict[str, str | int] = {
        "kernel": platform.release(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "ringfence": importlib.metadata.version("ringfence"),
    }
    if bwrap is not None:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=False)
        facts["bwrap"] = version.stdout.strip().removeprefix("bubblewrap ")
    return facts


# -- main ---------------------------------------------------------------------------------------


def local_contenders(executor: Executor | None, bwrap: str | None) -> list[Contender]:
    """Ringfence, the raw-bwrap floor and the reference lines that need no container engine."""
    contenders: list[Contender] = []
    if executor is not None:
        contenders.append(
            Contender(
                "ringfence",
                RINGFENCE_NAME,
                f"await executor.execute(ExecutionRequest(command=['{TRUE}'])), executor = "
                f"create_executor(Config(backend='local')), named {executor.name!r}: "
                "namespaces + seccomp + cgroups",
                ringfence_runner(executor),
            )
        )
    if bwrap is not None:
        floor, shaped = raw_bwrap_argv(bwrap), ringfence_shaped_bwrap_argv(bwrap)
        contenders += [
            Contender(
                "raw_bwrap",
                RAW_BWRAP_NAME,
                f"subprocess.run: {shlex.join(floor)}",
                blocking_runner(floor),
            ),
            Contender(
                "ringfence_shaped_bwrap",
                "bwrap shaped like Ringfence's",
                "subprocess.run, Ringfence's namespaces and mounts without its seccomp filter, "
                f"cgroup, uid drop or Python: {shlex.join(shaped)}",
                blocking_runner(shaped),
            ),
        ]
    contenders.append(
        Contender(
            "plain",
            f"plain {TRUE} (no sandbox)",
            f"subprocess.run: {TRUE}",
            blocking_runner([TRUE]),
        )
    )
    return contenders


def throughput_contenders(
    executor: Executor | None, bwrap: str | None, pool: ThreadPoolExecutor, threads: int
) -> list[Throughput]:
    tallies: list[Throughput] = []
    if executor is not None:
        tallies.append(
            Throughput(
                "ringfence",
                RINGFENCE_NAME,
                "executor.execute, asyncio.gather over a semaphore",
                ringfence_runner(executor),
            )
        )
    if bwrap is not None:
        argv = raw_bwrap_argv(bwrap)
        tallies.append(
            Throughput(
                "raw_bwrap",
                RAW_BWRAP_NAME,
                f"subprocess.run on {threads} threads: {shlex.join(argv)}",
                threaded_runner(argv, pool),
            )
        )
    return tallies


async def benchmark(args: argparse.Namespace) -> Report:
    config = Config(backend="local")  # never the unisolated backend, whatever the environment
    bwrap = shutil.which(bwrap_choice(config))  # the one Ringfence runs: the floor's too
    missing: list[Missing] = []
    if bwrap is None:
        missing.append(Missing("raw_bwrap", RAW_BWRAP_NAME, f"{config.bwrap_path} not found"))
    executor: Executor | None = None
    try:
        executor = create_executor(config)
    except RingfenceError as exc:
        missing.append(Missing("ringfence", RINGFENCE_NAME, exc.message))
    except Exception as exc:  # a report, not a test: list Ringfence as broken and go on
        missing.append(Missing("ringfence", RINGFENCE_NAME, f"{type(exc).__name__}: {exc}"))
    try:
        contenders = local_contenders(executor, bwrap)
        if args.no_peers:
            missing += [Missing(key, name, "skipped (--no-peers)") for key, name in PEER_NAMES]
        else:
            found, absent = peers(args.image)
            contenders += found
            missing += absent
        await measure_latency(contenders, args.iterations, args.warmup)
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            tallies = throughput_contenders(executor, bwrap, pool, args.concurrency)
            await measure_throughput(tallies, args.throughput_executions, args.concurrency)
    finally:
        if executor is not None:
            await executor.aclose()

    return Report(
        host=host_facts(bwrap),
        iterations=args.iterations,
        warmup=args.warmup,
        concurrency=args.concurrency,
        throughput_executions=args.throughput_executions,
        contenders=contenders,
        missing=missing,
        throughput=tallies,
    )


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Latency and throughput of Ringfence's isolated executions, next to raw "
        "bubblewrap and, where they work, docker, podman and runsc. Always exits 0 once it "
        "has run: timings are reported, never asserted."
    )
    parser.add_argument(
        "--iterations",
        type=at_least(1),
        default=200,
        help="measured sequential runs per contender (default 200)",
    )
    parser.add_argument(
        "--warmup",
        type=at_least(0),
        default=10,
        help="unmeasured runs per contender first (default 10)",
    )
    parser.add_argument(
        "--concurrency",
        type=at_least(1),
        default=8,
        help="executions at once in the throughput test (default 8)",
    )
    parser.add_argument(
        "--throughput-executions",
        type=at_least(1),
        default=400,
        help="executions per contender in the throughput test (default 400)",
    )
    parser.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        help=f"local image with /bin/true for docker and podman (default {DEFAULT_IMAGE})",
    )
    parser.add_argument("--no-peers", action="store_true", help="skip docker, podman and runsc")
    parser.add_argument(
        "--json",
        action="store_true",
        help="also print the results as one line of JSON, after the report",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(benchmark(args))
    print(report.render())
    if args.json:
        print(json.dumps(report.to_json(), sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
