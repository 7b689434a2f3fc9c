"""What a project view costs (docs/design.md 14.7), with baselines from the same run. A
report: it never fails on timing. Root, on the local backend (see bench/README.md).

* start p50 of an interactive sandbox with a project view of a 1,000-file directory, against
  one without (the same runtime, alternating): the view's idmapped mount and overlay;
* diff p50 of that project after the sandbox changed 100 files (text, 1 KiB each), and
  ``git diff --no-index --stat`` of the same two trees as a baseline (a copy of the host's
  directory and one with the sandbox's changes: what diffing costs with no overlay at all);
* sync p50 of those 100 changes (applied to a fresh copy of the host directory each time),
  against ``cp`` of the 100 changed files.

    .venv/bin/python bench/project.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ringfence import projects
from ringfence.backends._interactive import BoundProject, LaunchSpec
from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.config import Config
from ringfence.models import ResourceLimits
from ringfence.testing.backend_checks import run_in_sandbox

OWNER = 4242
FILES = 1000
CHANGED = 100
TARGET = "/home/user/project"


def _project(root: Path) -> Path:
    project = root / "project"
    for index in range(FILES):
        path = project / f"d{index // 100}" / f"f{index}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"line {n} of file {index}\n" for n in range(50)))
    for path in [project, *project.rglob("*")]:
        os.chown(path, OWNER, OWNER)
    return project


def _spec(project: Path | None) -> LaunchSpec:
    bound = BoundProject(project, TARGET) if project is not None else None
    return LaunchSpec(image="host", env={}, limits=ResourceLimits(disk=128 << 20), timeout=300,
                      project=bound)  # fmt: skip


async def _timed(work: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await work()
    return (time.perf_counter() - start) * 1000


def _p50(samples: list[float]) -> str:
    return f"{statistics.median(samples):7.2f} ms p50 ({len(samples)} runs)"


async def main(rounds: int) -> None:
    config = Config(pool_sizes={})
    runtime = LocalSandboxRuntime(LocalExecutor(config), config)
    with tempfile.TemporaryDirectory(prefix="rf-bench-project-") as scratch:
        root = Path(scratch)
        project = _project(root)
        plain_starts: list[float] = []
        project_starts: list[float] = []
        for _ in range(rounds):
            for spec, samples in ((_spec(None), plain_starts), (_spec(project), project_starts)):
                started: list[object] = []

                async def launch(spec: LaunchSpec = spec, started: list[object] = started) -> None:
                    started.append(await runtime.start(spec))

                samples.append(await _timed(launch))
                await started[0].kill()  # type: ignore[attr-defined]
        print(f"start, no project          {_p50(plain_starts)}")
        print(f"start, {FILES}-file project   {_p50(project_starts)}")

        sandbox = await runtime.start(_spec(project))
        try:
            edit = "; ".join(
                f"echo changed >> {TARGET}/d{i // 100}/f{i}.txt" for i in range(0, FILES, 10)
            )
            await run_in_sandbox(sandbox, "sh", "-c", edit)
            upper = sandbox.project_layer
            assert upper is not None
            diffs: list[float] = []
            for _ in range(rounds):
                start = time.perf_counter()
                changes, _ = await asyncio.to_thread(projects.diff, upper, project)
                diffs.append((time.perf_counter() - start) * 1000)
            assert len(changes) == CHANGED, len(changes)
            print(f"diff, {CHANGED} changed            {_p50(diffs)}")

            after = root / "after"
            shutil.copytree(project, after, symlinks=True)
            for change in changes:
                (after / change.path).write_text((after / change.path).read_text() + "changed\n")
            gits: list[float] = []
            for _ in range(rounds):
                start = time.perf_counter()
                subprocess.run(["git", "diff", "--no-index", "--stat", str(project), str(after)],
                               capture_output=True)  # fmt: skip
                gits.append((time.perf_counter() - start) * 1000)
            print(f"  baseline: git diff --no-index --stat  {_p50(gits)}")

            syncs: list[float] = []
            copies: list[float] = []
            for index in range(rounds):
                target = root / f"sync{index}"
                shutil.copytree(project, target, symlinks=True)
                for path in [target, *target.rglob("*")]:
                    os.chown(path, OWNER, OWNER)
                start = time.perf_counter()
                applied, refused = await asyncio.to_thread(projects.sync, upper, target, None)
                syncs.append((time.perf_counter() - start) * 1000)
                assert len(applied) == CHANGED and not refused, (len(applied), refused[:3])
                start = time.perf_counter()
                for change in changes:
                    shutil.copyfile(after / change.path, target / change.path)
                copies.append((time.perf_counter() - start) * 1000)
            print(f"sync, {CHANGED} changed            {_p50(syncs)}")
            print(f"  baseline: copy of the {CHANGED} files   {_p50(copies)}")
        finally:
            await sandbox.kill()
    await runtime.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    asyncio.run(main(parser.parse_args().rounds))
