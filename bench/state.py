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

Part two, whole sandboxes through the API (pause that frees memory and resume at 200 MiB,
fork(4) of a 50 MiB sandbox, 1,000 paused sandboxes holding no memory), is measured by the
functions listed in ``SANDBOX_LINES``: each takes the parsed arguments and returns its
``Line``s; an empty list means part two is not written yet, and the report says so.
"""

from __future__ import annotations

import argparse
import contextlib
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
SANDBOX_LINES: list[SandboxLine] = []  # part two (the API engineer's): pause/resume, fork...


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
        store = SnapshotStore(root / "snapshots", layers, OWNERS, Budget(8, 8 << 30), KEY)
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
            "not measured (part two: SANDBOX_LINES is empty)"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50, help="rounds for the 200-file tree")
    parser.add_argument("--big-rounds", type=int, default=10, help="rounds at 20,000 files")
    parser.add_argument("--export-rounds", type=int, default=5)
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
        for measure in SANDBOX_LINES:
            lines += measure(args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(lines, not SANDBOX_LINES))
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
