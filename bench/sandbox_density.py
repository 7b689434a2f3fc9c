"""How many idle interactive sandboxes fit on a host, and what each one costs in memory.

The script starts a real ``ringfence serve`` on a loopback port, creates ``--count``
sandboxes over HTTP (``--concurrency`` at a time, each with a small memory limit), leaves
them idle, then measures what each one holds, three ways:

* PSS: the proportional set size (``/proc/PID/smaps_rollup``) summed over the sandbox's host
  processes: the daemon (found by ``RINGFENCE_SANDBOX_ID=<id>`` in its environment, as a
  uid of the sandbox range) and anything it started, plus the two bubblewrap processes above
  it (found by walking parent pids up to the server). Shared pages are split between their
  sharers, so the sum over all sandboxes is what they take together;
* the sandbox's cgroup: ``memory.usage_in_bytes`` (cgroup v1) or ``memory.current`` (v2),
  what the kernel charges against the sandbox's limit (its processes' anonymous memory and
  the page cache and kernel memory they caused, not the outer bwrap);
* the host: the drop of ``MemAvailable`` from before the first create to after the last,
  divided by the count (includes the server's own growth and every kernel structure).

Then it kills them all, checks that nothing of them remains, and stops the server. This is
a report: it exits 0 whatever it measured (2 if it refused to start). See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from exec_latency import Stats, at_least, host_facts, progress
from sandbox_latency import Server, running_server

from ringfence.config import Config

GOAL_MB = 10.0  # per idle sandbox
GOAL_ALIVE = 500  # at once
RESERVE_MB = 30  # what each sandbox is assumed to need when checking the host has room
HEADROOM_MB = 1024  # left to everything else on the host
SANDBOX_TIMEOUT = 3600  # seconds: the script kills them, but a lost one must die on its own
MB = 1 << 20
ID_VARIABLE = b"RINGFENCE_SANDBOX_ID="


# -- reading the host ---------------------------------------------------------------------------


def mem_available() -> int:
    """Bytes the kernel says can be given to new work without swapping."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def pss(pid: int, kind: str = "Pss") -> int:
    """Proportional set size of ``pid`` in bytes (``kind`` "Pss_Anon": its anonymous part);
    0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(kind + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def status_field(pid: int, name: str) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def parent(pid: int) -> int | None:
    value = status_field(pid, "PPid")
    return int(value) if value else None


def sandbox_of(pid: int) -> str | None:
    """The sandbox id in the environment of ``pid``, if it has one."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(ID_VARIABLE):
            return entry[len(ID_VARIABLE) :].decode()
    return None


def cgroup_memory(pid: int) -> tuple[Path, int] | None:
    """The memory cgroup of ``pid`` and its current charge in bytes (v1 or v2)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    entries = [line.split(":", 2) for line in lines]
    for _, controllers, path in entries:
        if "memory" in controllers.split(","):
            directory = Path("/sys/fs/cgroup/memory" + path)
            return directory, _read_int(directory / "memory.usage_in_bytes")
    for hierarchy, _, path in entries:
        if hierarchy == "0":
            directory = Path("/sys/fs/cgroup" + path)
            return directory, _read_int(directory / "memory.current")
    return None


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


@dataclass
class Footprint:
    """What one sandbox holds on the host."""

    sandbox_id: str
    inner: list[int] = field(default_factory=list)  # pids with the sandbox's id in environ
    wrappers: list[int] = field(default_factory=list)  # bwrap processes above them
    pss_inner: int = 0
    pss_wrappers: int = 0
    pss_anon: int = 0  # anonymous part of pss_inner + pss_wrappers: not shared page cache
    cgroup: Path | None = None
    cgroup_bytes: int = 0

    @property
    def pss(self) -> int:
        return self.pss_inner + self.pss_wrappers


def footprints(ids: set[str], server_pid: int, uids: range) -> dict[str, Footprint]:
    """Find each sandbox's host processes and measure them."""
    found = {sandbox_id: Footprint(sandbox_id) for sandbox_id in ids}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        real = status_field(pid, "Uid")
        if real is None or int(real.split()[0]) not in uids:
            continue
        sandbox_id = sandbox_of(pid)
        if sandbox_id in found:
            found[sandbox_id].inner.append(pid)
    for print_ in found.values():
        inner = set(print_.inner)
        wrappers: set[int] = set()
        for pid in print_.inner:
            up = parent(pid)
            # bwrap's two processes sit between the server and the daemon; stop at the server
            # (a chain that never reaches it is not this server's sandbox: count nothing).
            chain: list[int] = []
            while up is not None and up not in (server_pid, 0, 1):
                if up not in inner:
                    chain.append(up)
                up = parent(up)
            if up == server_pid:
                wrappers.update(chain)
        print_.wrappers = sorted(wrappers)
        print_.pss_inner = sum(pss(pid) for pid in print_.inner)
        print_.pss_wrappers = sum(pss(pid) for pid in print_.wrappers)
        print_.pss_anon = sum(pss(pid, "Pss_Anon") for pid in [*print_.inner, *print_.wrappers])
        if print_.inner:
            charged = cgroup_memory(min(print_.inner))
            if charged is not None:
                print_.cgroup, print_.cgroup_bytes = charged
    return found


# -- driving the server -------------------------------------------------------------------------


@dataclass
class Created:
    ids: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


async def create_all(
    client: httpx.AsyncClient, count: int, concurrency: int, memory: str
) -> Created:
    created = Created()
    gate = asyncio.Semaphore(concurrency)
    spec = {"timeout": SANDBOX_TIMEOUT, "limits": {"memory": memory}}
    step = max(1, count // 10)

    async def one() -> None:
        async with gate:
            begun = time.perf_counter()
            try:
                response = await client.post("/v1/sandboxes", json=spec)
            except httpx.HTTPError as exc:
                created.failures.append(f"{type(exc).__name__}: {exc}")
                return
            if response.status_code != 201:
                created.failures.append(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            created.latencies.append(time.perf_counter() - begun)
            created.ids.append(response.json()["id"])
            done = len(created.ids) + len(created.failures)
            if done % step == 0:
                progress(f"created {len(created.ids)}/{count} ({len(created.failures)} failed)")

    begun = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    created.seconds = time.perf_counter() - begun
    return created


async def kill_all(client: httpx.AsyncClient, ids: Sequence[str], concurrency: int) -> list[str]:
    """Kill every sandbox; return what went wrong."""
    gate = asyncio.Semaphore(concurrency)
    failures: list[str] = []

    async def one(sandbox_id: str) -> None:
        async with gate:
            try:
                response = await client.delete(f"/v1/sandboxes/{sandbox_id}")
            except httpx.HTTPError as exc:
                failures.append(f"{sandbox_id}: {type(exc).__name__}: {exc}")
                return
            if response.status_code != 200 or response.json()["state"] == "running":
                failures.append(f"{sandbox_id}: HTTP {response.status_code} {response.text[:200]}")

    await asyncio.gather(*(one(sandbox_id) for sandbox_id in ids))
    return failures


async def leftovers(
    client: httpx.AsyncClient, ids: set[str], server_pid: int, uids: range
) -> list[str]:
    """What remains of the sandboxes after the kill: processes, cgroups, running records."""
    remains: list[str] = []
    left = {i: f for i, f in footprints(ids, server_pid, uids).items() if f.inner or f.wrappers}
    if left:
        remains.append(f"{len(left)} sandbox(es) still have processes, e.g. {next(iter(left))}")
    cgroups = [
        d
        for root in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup"))
        for d in root.glob(f"**/ringfence/i{server_pid}/rf-*")
    ]
    if cgroups:
        remains.append(f"{len(cgroups)} sandbox cgroup(s) remain, e.g. {cgroups[0]}")
    response = await client.get("/v1/sandboxes", params={"state": "running", "limit": 1000})
    running = [s["id"] for s in response.json() if s["id"] in ids]
    if running:
        remains.append(f"{len(running)} sandbox(es) still recorded as running")
    return remains


# -- reporting ----------------------------------------------------------------------------------


def mb(value: float | None) -> str:
    return "-" if value is None else f"{value / MB:.2f}"


def in_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def spread(values: Sequence[int]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "max": None, "min": None}
    return {"median": statistics.median(values), "max": max(values), "min": min(values)}


@dataclass
class Report:
    host: dict[str, str | int]
    count: int
    concurrency: int
    memory_limit: str
    created: Created
    prints: list[Footprint]
    available_drop: int
    available_rise: int  # MemAvailable after the kill minus before it
    server_growth: int
    kill_seconds: float
    kill_failures: list[str]
    remains: list[str]

    @property
    def alive(self) -> int:
        return sum(1 for p in self.prints if p.inner)

    def goals(self) -> list[tuple[str, str, str]]:
        pss_median = spread([p.pss for p in self.prints])["median"]
        cg_median = spread([p.cgroup_bytes for p in self.prints])["median"]
        judged = []
        for what, value in (("PSS", pss_median), ("cgroup", cg_median)):
            verdict = "UNKNOWN" if value is None else "PASS" if value <= GOAL_MB * MB else "MISS"
            judged.append(
                (f"idle sandbox <= {GOAL_MB:g} MB ({what}, median)", verdict, f"{mb(value)} MB")
            )
        if self.count < GOAL_ALIVE:
            verdict = "NOT RUN"
            detail = f"{self.alive} alive at once; run with --count {GOAL_ALIVE}"
        else:
            verdict = "PASS" if self.alive >= GOAL_ALIVE else "MISS"
            detail = f"{self.alive} of {self.count} alive at once"
        judged.append((f"{GOAL_ALIVE} sandboxes alive at once", verdict, detail))
        clean = "PASS" if not self.remains and not self.kill_failures else "MISS"
        judged.append(("nothing remains after the kill", clean, "; ".join(self.remains) or "ok"))
        return judged

    def render(self) -> str:
        c = self.created
        per_second = len(c.ids) / c.seconds if c.seconds else 0.0
        latency = Stats.of(c.latencies)
        host = ", ".join(f"{k} {v}" for k, v in self.host.items())
        views = [
            ("PSS, all host processes", [p.pss for p in self.prints]),
            ("  of which the daemon (+ children)", [p.pss_inner for p in self.prints]),
            ("  of which the 2 bwrap processes", [p.pss_wrappers for p in self.prints]),
            ("  of which anonymous (Pss_Anon)", [p.pss_anon for p in self.prints]),
            ("cgroup memory charge", [p.cgroup_bytes for p in self.prints]),
        ]
        out = [
            f"host: {host}",
            "",
            f"Created {len(c.ids)} of {self.count} sandboxes (memory limit {self.memory_limit}), "
            f"{self.concurrency} at a time, in {c.seconds:.1f} s: {per_second:.1f} per second; "
            f"create latency p50 {in_ms(latency and latency.median)} ms, "
            f"p99 {in_ms(latency and latency.p99)} ms",
        ]
        if c.failures:
            out.append(f"  {len(c.failures)} failed; first: {c.failures[0]}")
        out += [
            f"Alive when measured: {self.alive}",
            "",
            "Memory per idle sandbox",
            f"{'view':<40} {'median MB':>10} {'max MB':>9} {'min MB':>9} {'sum MB':>9}",
        ]
        for name, values in views:
            s = spread(values)
            out.append(
                f"{name:<40} {mb(s['median']):>10} {mb(s['max']):>9} {mb(s['min']):>9} "
                f"{mb(sum(values)):>9}"
            )
        n = max(len(c.ids), 1)
        out += [
            f"{'host MemAvailable drop / sandbox':<40} {mb(self.available_drop / n):>10}"
            f"{'':>20} {mb(self.available_drop):>9}",
            f"{'host MemAvailable rise at kill / sandbox':<40} {mb(self.available_rise / n):>10}"
            f"{'':>20} {mb(self.available_rise):>9}",
            f"{'  server process PSS growth / sandbox':<40} {mb(self.server_growth / n):>10}"
            f"{'':>20} {mb(self.server_growth):>9}",
            "",
            f"Killed them ({self.concurrency} at a time) in {self.kill_seconds:.1f} s"
            + (f"; {len(self.kill_failures)} kill(s) failed: {self.kill_failures[0]}"
               if self.kill_failures else ""),
            "",
            "Goals (other work on this shared machine moves MemAvailable; a report, not a test):",
        ]  # fmt: skip
        out += [f"  {text}: {verdict} ({detail})" for text, verdict, detail in self.goals()]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        c = self.created
        latency = Stats.of(c.latencies)
        n = max(len(c.ids), 1)

        def view(values: Sequence[int]) -> dict[str, float | None]:
            return {k: None if v is None else round(v / MB, 3) for k, v in spread(values).items()}

        return {
            "benchmark": "sandbox_density",
            "host": self.host,
            "count": self.count,
            "concurrency": self.concurrency,
            "memory_limit": self.memory_limit,
            "created": len(c.ids),
            "create_failures": len(c.failures),
            "create_seconds": round(c.seconds, 3),
            "creates_per_second": round(len(c.ids) / c.seconds, 2) if c.seconds else None,
            "create_p50_ms": None if latency is None else round(latency.median * 1000, 1),
            "create_p99_ms": None if latency is None else round(latency.p99 * 1000, 1),
            "alive": self.alive,
            "pss_mb": view([p.pss for p in self.prints]),
            "pss_daemon_mb": view([p.pss_inner for p in self.prints]),
            "pss_bwrap_mb": view([p.pss_wrappers for p in self.prints]),
            "pss_anon_mb": view([p.pss_anon for p in self.prints]),
            "cgroup_mb": view([p.cgroup_bytes for p in self.prints]),
            "mem_available_drop_per_sandbox_mb": round(self.available_drop / n / MB, 3),
            "mem_available_rise_at_kill_per_sandbox_mb": round(self.available_rise / n / MB, 3),
            "server_growth_per_sandbox_mb": round(self.server_growth / n / MB, 3),
            "kill_seconds": round(self.kill_seconds, 3),
            "kill_failures": self.kill_failures,
            "remains": self.remains,
            "goals": [{"goal": t, "verdict": v, "detail": d} for t, v, d in self.goals()],
        }


# -- main ---------------------------------------------------------------------------------------


async def benchmark(args: argparse.Namespace, server: Server) -> Report:
    first, last = Config().sandbox_uids
    uids = range(first, last + 1)  # each live sandbox has one of these
    async with server.client(timeout=120) as client:
        await asyncio.sleep(1)  # let the fresh server settle before the baseline
        before, server_before = mem_available(), pss(server.pid)
        progress(f"creating {args.count} sandboxes, {args.concurrency} at a time")
        created = await create_all(client, args.count, args.concurrency, args.memory)
        try:
            progress(f"idle for {args.settle:g} s, then measuring")
            await asyncio.sleep(args.settle)
            after, server_after = mem_available(), pss(server.pid)
            found = footprints(set(created.ids), server.pid, uids)
        finally:
            progress(f"killing {len(created.ids)} sandboxes")
            begun = time.perf_counter()
            kill_failures = await kill_all(client, created.ids, args.concurrency)
            kill_seconds = time.perf_counter() - begun
        await asyncio.sleep(args.settle)
        after_kill = mem_available()
        remains = await leftovers(client, set(created.ids), server.pid, uids)
    return Report(
        host={**host_facts(None), "MemAvailable MB": before // MB},
        count=args.count,
        concurrency=args.concurrency,
        memory_limit=args.memory,
        created=created,
        prints=list(found.values()),
        available_drop=before - after,
        available_rise=after_kill - after,
        server_growth=server_after - server_before,
        kill_seconds=kill_seconds,
        kill_failures=kill_failures,
        remains=remains,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Memory per idle interactive sandbox (PSS, cgroup charge, MemAvailable) "
        "and creation throughput, through a real ringfence serve. Exits 0 once it has run."
    )
    parser.add_argument(
        "-n", "--count", type=at_least(1), default=100, help="sandboxes alive at once (100)"
    )
    parser.add_argument(
        "--concurrency", type=at_least(1), default=8, help="creates (and kills) at once (8)"
    )
    parser.add_argument("--memory", default="32M", help="each sandbox's memory limit (32M)")
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds idle before measuring (2)"
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the results as one line of JSON, last"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    available = mem_available()
    needed = args.count * RESERVE_MB * MB + HEADROOM_MB * MB
    if needed > available:
        print(
            f"Not starting: {args.count} sandboxes at {RESERVE_MB} MB each plus {HEADROOM_MB} MB "
            f"of headroom need {needed // MB} MB, and only {available // MB} MB is available. "
            "Try a smaller --count.",
            file=sys.stderr,
        )
        return 2
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
