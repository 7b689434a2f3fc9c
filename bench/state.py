"""What capturing and restoring a sandbox's state costs (issue 16), with baselines measured in
the same run. A report: it never fails on timing. See bench/README.md.

Part one, the host-side engine (``ringfence.backends.local.snapshots`` and the cgroup
freezer), on a real tmpfs volume the script mounts, files owned by an unprivileged uid as a
sandbox's are:

* checkpoint p50, 200 files / 20 MiB, one file changed between checkpoints: freeze a real
  cgroup (two busy processes and eight idle ones in it), ``SnapshotStore.take()``, thaw;
* rollback p50, same tree, one file changed since: freeze, ``restore()``, thaw;
* the same at 20,000 files (100 directories of 200 files of 1 KiB);
* freeze + thaw p50 of that cgroup;
* export (a sealed copy on the host's disk) and populate (a fresh volume from it) of 50 MiB.

Baselines, each in the same run on the same tree: ``cp -a`` of the tree on the volume, a full
copy with ``shutil.copytree`` (what a non-incremental checkpoint costs at the least), and
``cp -a`` of the 50 MiB tree to disk (what an export costs at the least).

Part two, whole sandboxes through the API of a real ``ringfence serve`` (pause that frees
memory and resume at 200 MiB against a cold create, fork(4) of a 50 MiB sandbox against four
creates at once, ``--paused`` (1,000) sandboxes paused to disk and what they still hold), is
measured by the functions listed in ``SANDBOX_LINES``: each takes the parsed arguments and
returns its ``Line``s (``--no-sandboxes`` skips them).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ringfence.backends.local.cgroups import Cgroup, V1Driver, detect
from ringfence.backends.local.snapshots import Budget, SnapshotStore, populate
from ringfence.models import ResourceLimits

UID = 61_999  # the files' owner: an unprivileged uid, as a sandbox's are
OWNERS = (UID, UID + 1)
KEY = os.urandom(32)
GOALS_MS = {
    "checkpoint, 200 files / 20 MiB, 1 changed": 5.0,  # DeltaBox: 10.8 ms
    "rollback, 200 files / 20 MiB, 1 changed": 2.0,  # DeltaBox: 1.9 ms
    "checkpoint, 20,000 files, 1 changed": 300.0,
    "rollback, 20,000 files, 1 changed": 300.0,  # no goal of its own: the checkpoint's
    "freeze + thaw": 5.0,
    "resume (files), 200 MiB": 200.0,  # GKE Agent Sandbox: 200 ms; E2B: about 1 s
    "fork(4), 50 MiB": 500.0,
}


@dataclass(frozen=True)
class Line:
    """One measured line of the report: its samples in seconds, and what it is compared
    with (another line's name, measured in the same run)."""

    name: str
    samples: tuple[float, ...]
    baseline: str | None = None
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


SandboxLine = Callable[[argparse.Namespace], list[Line]]


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- fixtures ---------------------------------------------------------------------------------


@contextlib.contextmanager
def volume(parent: Path, name: str, size: str = "1g") -> Iterator[Path]:
    where = parent / name
    where.mkdir(mode=0o755)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", where], check=True
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=True)
        where.rmdir()


def fill(root: Path, dirs: int, files: int, size: int) -> list[Path]:
    """``dirs`` directories of ``files`` files of ``size`` random bytes, owned by UID."""
    made = []
    for d in range(dirs):
        directory = root / f"d{d}"
        directory.mkdir()
        os.chown(directory, UID, UID)
        for f in range(files):
            path = directory / f"f{f}"
            path.write_bytes(os.urandom(size))
            os.chown(path, UID, UID)
            made.append(path)
    return made


def layers_in(root: Path) -> dict[str, Path]:
    layers = {}
    for name in ("workspace", "tmp"):
        layers[name] = root / name
        layers[name].mkdir()
        os.chown(layers[name], UID, UID)
    (root / "snapshots").mkdir(mode=0o700)
    return layers


@contextlib.contextmanager
def busy_cgroup() -> Iterator[Cgroup]:
    """A real sandbox-like cgroup: two processes spinning, eight sleeping."""
    driver = detect()
    if isinstance(driver, V1Driver) and not driver.can_freeze:
        raise SystemExit("this host has no freezer: nothing to measure")
    limits = ResourceLimits(memory=512 << 20, pids=64, cpus=2, disk=1 << 30)
    cgroup = driver.create(f"bench-state-{os.getpid()}", limits)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    procs += [subprocess.Popen(["sleep", "3600"]) for _ in range(8)]
    try:
        for proc in procs:
            cgroup.add(proc.pid)
        yield cgroup
    finally:
        cgroup.remove()
        for proc in procs:
            proc.wait()


def timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


# -- part one ---------------------------------------------------------------------------------


def checkpoint_lines(
    work: Path, cgroup: Cgroup, label: str, dirs: int, files: int, size: int, rounds: int
) -> list[Line]:
    with volume(work, f"vol-{dirs}x{files}") as root:
        layers = layers_in(root)
        made = fill(layers["workspace"], dirs, files, size)
        store = SnapshotStore(
            root / "snapshots", layers, OWNERS, Budget(8, 8 << 30), KEY, pids=cgroup.pids
        )  # as a sandbox's: its processes' shared writable mappings are read at each call
        time.sleep(0.02)  # past the clock tick the files were written in
        with cgroup.frozen():
            store.take()
        takes, restores, copies, trees = [], [], [], []
        victim = made[len(made) // 2]
        for i in range(rounds):
            victim.write_bytes(os.urandom(size))  # one file changed since the last one

            def take() -> None:
                with cgroup.frozen():
                    store.take()

            takes.append(timed(take))
            checkpoints = store.list()
            for old in checkpoints[:-2]:
                store.delete(old.id)
            victim.write_bytes(os.urandom(size))  # and changed again: roll it back

            def rollback(target: str = checkpoints[-1].id) -> None:
                with cgroup.frozen():
                    store.restore(target)

            restores.append(timed(rollback))
            if i % 5 == 0:  # the baselines: fewer rounds, they are slow
                dest = root / "copy"
                copies.append(
                    timed(
                        subprocess.run,
                        ["cp", "-a", str(layers["workspace"]), str(dest)],
                        check=True,
                    )
                )
                shutil.rmtree(dest)
                trees.append(timed(shutil.copytree, layers["workspace"], dest, symlinks=True))
                shutil.rmtree(dest)
    cp_name, tree_name = f"cp -a of the tree ({label})", f"shutil.copytree ({label})"
    return [
        Line(f"checkpoint, {label}, 1 changed", tuple(takes), cp_name, "freeze + take + thaw"),
        Line(f"rollback, {label}, 1 changed", tuple(restores), cp_name, "freeze + restore + thaw"),
        Line(cp_name, tuple(copies)),
        Line(tree_name, tuple(trees)),
    ]


def freeze_line(cgroup: Cgroup, rounds: int) -> Line:
    def cycle() -> None:
        cgroup.freeze()
        cgroup.thaw()

    return Line(
        "freeze + thaw",
        tuple(timed(cycle) for _ in range(rounds)),
        None,
        "2 busy + 8 idle processes",
    )


def export_lines(work: Path, rounds: int) -> list[Line]:
    exports, populates, copies = [], [], []
    disk = Path(tempfile.mkdtemp(prefix="rf-bench-export-", dir="/var/tmp"))
    try:
        with volume(work, "vol-export") as root, volume(work, "vol-child") as child_root:
            layers = layers_in(root)
            fill(layers["workspace"], 10, 50, 100 << 10)  # 50 MiB
            store = SnapshotStore(root / "snapshots", layers, OWNERS, Budget(8, 8 << 30), KEY)
            checkpoint = store.take()
            child = layers_in(child_root)
            for i in range(rounds):
                target = disk / f"export-{i}"
                exports.append(timed(store.export, checkpoint.id, target))
                populates.append(timed(populate, target, child, OWNERS, KEY))
                for layer in child.values():
                    for entry in layer.iterdir():
                        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
                shutil.rmtree(target)
                dest = disk / "cp"
                copies.append(
                    timed(
                        subprocess.run,
                        ["cp", "-a", str(layers["workspace"]), str(dest)],
                        check=True,
                    )
                )
                shutil.rmtree(dest)
    finally:
        shutil.rmtree(disk)
    return [
        Line("export, 50 MiB (to disk)", tuple(exports), "cp -a of 50 MiB to disk"),
        Line("populate, 50 MiB (from disk)", tuple(populates), "cp -a of 50 MiB to disk"),
        Line("cp -a of 50 MiB to disk", tuple(copies)),
    ]


# -- part two: whole sandboxes through the API ------------------------------------------------

MiB = 1 << 20
_FILL = (
    "import os\n"
    "for n in range({files}):\n"
    "    with open(f'/home/user/fill{{n}}', 'wb') as f:\n"
    "        for _ in range({mib}):\n"
    "            f.write(os.urandom(1 << 20))\n"
)


@contextlib.contextmanager
def api_server() -> Iterator[Any]:
    """A real ``ringfence serve`` (bench/sandbox_latency.py's), and an HTTP client of it."""
    sys.path.insert(0, str(Path(__file__).parent))
    from sandbox_latency import running_server

    with running_server() as server:
        headers = {"Authorization": f"Bearer {server.key}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=300) as http:
            yield http


def _created(http: httpx.Client, **spec: Any) -> str:
    created = http.post("/v1/sandboxes", json={"timeout": 3600, **spec})
    if created.status_code != 201:
        raise RuntimeError(f"create: {created.status_code} {created.text}")
    sandbox_id: str = created.json()["id"]
    return sandbox_id


def _filled(http: httpx.Client, size_mib: int) -> str:
    """A sandbox holding ``size_mib`` MiB of random files in its home (files of 10 MiB)."""
    disk = f"{size_mib + 64}M"
    sandbox_id = _created(http, limits={"disk": disk, "memory": "512M"})
    code = _FILL.format(files=max(1, size_mib // 10), mib=min(size_mib, 10))
    ran = http.post(f"/v1/sandboxes/{sandbox_id}/code/execute", json={"code": code})
    if ran.status_code != 200 or '"error"' in ran.text:
        raise RuntimeError(f"filling the sandbox: {ran.status_code} {ran.text[:300]}")
    return sandbox_id


def _timed(call: Callable[[], httpx.Response], want: int) -> float:
    started = time.perf_counter()
    answer = call()
    took = time.perf_counter() - started
    if answer.status_code != want:
        raise RuntimeError(f"{answer.request.url}: {answer.status_code} {answer.text[:300]}")
    return took


def pause_resume_lines(args: argparse.Namespace) -> list[Line]:
    """Pause freeing memory, resume, and a cold create (the baseline), at 200 MiB."""
    pauses, resumes, creates = [], [], []
    with api_server() as http:
        sandbox_id = _filled(http, 200)
        base = f"/v1/sandboxes/{sandbox_id}"
        for _ in range(args.pause_rounds):
            pauses.append(_timed(lambda: http.post(f"{base}/pause", json={"memory": False}), 200))
            resumes.append(_timed(lambda: http.post(f"{base}/resume"), 200))
            started = time.perf_counter()
            cold = _created(http)
            creates.append(time.perf_counter() - started)
            http.delete(f"/v1/sandboxes/{cold}")
        frozen = [_timed(lambda: http.post(f"{base}/pause", json={"memory": True}), 200)]
        thawed = [_timed(lambda: http.post(f"{base}/resume"), 200)]
        http.delete(base)
    return [
        Line("pause (memory freed), 200 MiB", tuple(pauses), "create (cold)"),
        Line("resume (files), 200 MiB", tuple(resumes), "create (cold)"),
        Line(
            "pause (memory kept) + resume, 200 MiB",
            tuple(a + b for a, b in zip(frozen, thawed, strict=True)),
        ),
        Line("create (cold)", tuple(creates)),
    ]


def fork_lines(args: argparse.Namespace) -> list[Line]:
    """fork(4) of a sandbox holding 50 MiB, and 4 cold creates at once (the baseline)."""
    forks, creates = [], []
    with api_server() as http:
        parent = _filled(http, 50)
        for _ in range(args.fork_rounds):
            started = time.perf_counter()
            forked = http.post(f"/v1/sandboxes/{parent}/fork", json={"count": 4})
            forks.append(time.perf_counter() - started)
            if forked.status_code != 201:
                raise RuntimeError(f"fork: {forked.status_code} {forked.text[:300]}")
            for child in forked.json()["children"]:
                http.delete(f"/v1/sandboxes/{child['id']}")
            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                made = list(pool.map(lambda _: _created(http), range(4)))
            creates.append(time.perf_counter() - started)
            for sandbox_id in made:
                http.delete(f"/v1/sandboxes/{sandbox_id}")
    return [
        Line("fork(4), 50 MiB", tuple(forks), "4 creates at once (cold)"),
        Line("4 creates at once (cold)", tuple(creates)),
    ]


def paused_many_lines(args: argparse.Namespace) -> list[Line]:
    """``--paused`` sandboxes created and paused to disk one after another: what they hold
    then (MemAvailable, processes of sandbox uids) is what 1,000 paused sandboxes cost."""
    count = args.paused
    pauses = []
    with api_server() as http:
        before = _mem_available()
        for n in range(count):
            sandbox_id = _created(http, limits={"disk": "16M"})
            url = f"/v1/sandboxes/{sandbox_id}/pause"
            pauses.append(_timed(functools.partial(http.post, url, json={}), 200))
            if n % 100 == 99:
                progress(f"{n + 1} paused")
        held = max(0, before - _mem_available())
        listed = http.get("/v1/sandboxes", params={"state": "paused", "limit": 1000}).json()
        running = _metric(http.get("/v1/metrics").text, "ringfence_sandboxes_running")
    note = (
        f"{count} paused: {len(listed)} listed paused, {running} running; MemAvailable "
        f"{held / MiB:.0f} MiB lower ({held / max(count, 1) / 1024:.1f} KiB each)"
    )
    return [Line(f"pause of each of {count} sandboxes (memory freed)", tuple(pauses), note=note)]


def _metric(text: str, name: str) -> int:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    return -1


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


SANDBOX_LINES: list[SandboxLine] = [pause_resume_lines, fork_lines, paused_many_lines]


# -- report -----------------------------------------------------------------------------------


def render(lines: Sequence[Line], missing_part_two: bool) -> str:
    by_name = {line.name: line for line in lines}
    out = [f"{'line':<48} {'p50 ms':>9} {'p90 ms':>9} {'n':>4}  vs baseline"]
    for line in lines:
        p90 = "-"
        if len(line.samples) > 1:
            p90 = f"{statistics.quantiles(line.samples, n=10)[8] * 1e3:.2f}"
        ratio = ""
        if line.baseline in by_name:
            ratio = f"{line.median / by_name[line.baseline].median:.3f}x {line.baseline}"
        out.append(
            f"{line.name:<48} {line.median * 1e3:9.2f} {p90:>9} "
            f"{len(line.samples):4}  {ratio}{'  (' + line.note + ')' if line.note else ''}"
        )
    out.append("")
    out.append("goals (p50):")
    for name, goal in GOALS_MS.items():
        if name not in by_name:
            out.append(f"  {name} <= {goal:g} ms: not measured")
            continue
        got = by_name[name].median * 1e3
        out.append(f"  {name} <= {goal:g} ms: {got:.2f} ms, {'met' if got <= goal else 'MISSED'}")
    if missing_part_two:
        out.append(
            "  pause/resume at 200 MiB, fork(4) of 50 MiB, 1,000 paused sandboxes: "
            "not measured (--no-sandboxes)"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50, help="rounds for the 200-file tree")
    parser.add_argument("--big-rounds", type=int, default=10, help="rounds at 20,000 files")
    parser.add_argument("--export-rounds", type=int, default=5)
    parser.add_argument("--pause-rounds", type=int, default=10, help="pause/resume at 200 MiB")
    parser.add_argument("--fork-rounds", type=int, default=5, help="fork(4) of 50 MiB")
    parser.add_argument("--paused", type=int, default=1000, help="sandboxes paused at once")
    parser.add_argument("--no-sandboxes", action="store_true", help="skip part two")
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: the script mounts tmpfs volumes and makes cgroups")
    work = Path(tempfile.mkdtemp(prefix="rf-bench-state-"))
    lines: list[Line] = []
    try:
        with busy_cgroup() as cgroup:
            progress("freeze + thaw")
            lines.append(freeze_line(cgroup, args.rounds * 4))
            progress("200 files / 20 MiB")
            lines += checkpoint_lines(
                work, cgroup, "200 files / 20 MiB", 4, 50, 100 << 10, args.rounds
            )
            progress("20,000 files")
            lines += checkpoint_lines(
                work, cgroup, "20,000 files", 100, 200, 1 << 10, args.big_rounds
            )
        progress("export / populate, 50 MiB")
        lines += export_lines(work, args.export_rounds)
        for measure in [] if args.no_sandboxes else SANDBOX_LINES:
            progress(measure.__name__.replace("_", " "))
            lines += measure(args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(lines, args.no_sandboxes))
    if args.json:
        print(
            json.dumps(
                {
                    line.name: {
                        "p50_ms": line.median * 1e3,
                        "n": len(line.samples),
                        "baseline": line.baseline,
                    }
                    for line in lines
                }
            )
        )


if __name__ == "__main__":
    main()
