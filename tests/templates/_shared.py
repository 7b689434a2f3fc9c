"""Templates built once per test run and shared by every pytest-xdist worker.

A template build takes minutes; two modules that need the same recipe (or every worker
that runs one of them) wait for one build instead of making their own. The first worker to
ask builds it with ``ringfence template build`` under an exclusive lock; the others wait on
that lock and then read the result (or the same failure: its log is kept). Each worker holds
a shared lock on its run's ``alive`` file while it runs; the last worker of the run to finish
(``release``, at the end of its session) removes the run's templates, and a later run
removes those of runs whose ``alive`` file nobody holds any more (a run killed midway).
Runs beside each other (other checkouts on the same machine) never touch each other's.

For a developer's repeated runs, ``RINGFENCE_TEST_KEEP_TEMPLATES=DIR`` keeps each build in
``DIR`` (named by its recipe's packages) across runs instead: nothing there is swept. CI
never sets it, so CI always builds what it tests.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["Built", "release", "shared_template"]

ROOT = Path("/tmp/ringfence-test-templates")
RINGFENCE = str(Path(sys.executable).parent / "ringfence")
_alive: dict[str, IO[str]] = {}  # run id -> its alive file, held (shared) for our life


@dataclass(frozen=True)
class Built:
    data_dir: Path  # a data directory whose registry holds the template
    rootfs: Path
    log: str  # the build's progress output (stderr)
    seconds: float  # how long the build took (whichever worker ran it)


def shared_template(recipe: str, timeout: float = 1700) -> Built:
    """The template ``recipe`` (built with that recipe, under that name) of this run,
    built now if no worker has yet. Fails the calling test if the build failed."""
    kept = os.environ.get("RINGFENCE_TEST_KEEP_TEMPLATES")
    if kept:
        return _kept(Path(kept), recipe, timeout)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"p{os.getpid()}"
    ROOT.mkdir(mode=0o755, exist_ok=True)
    ROOT.chmod(0o755)  # the unprivileged sandbox uids traverse it
    _hold_alive(run)
    home = ROOT / run / recipe
    with open(ROOT / f"{run}-{recipe}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _sweep(run)
        done = home / "done"
        if not done.exists():
            _build(recipe, home, timeout)
    return _result(home, recipe)


def _kept(directory: Path, recipe: str, timeout: float) -> Built:
    from ringfence.templates.build import PYPI_RECIPES, RECIPES

    what = json.dumps([RECIPES[recipe], PYPI_RECIPES.get(recipe, ())]).encode()
    home = directory / f"{recipe}-{hashlib.sha256(what).hexdigest()[:12]}"
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(directory / f"{recipe}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "done").exists():
            _build(recipe, home, timeout)
    return _result(home, recipe)


def _result(home: Path, recipe: str) -> Built:
    result = (home / "done").read_text().split("\n", 1)
    seconds, log = float(result[0]), result[1]
    rootfs = home / "ringfence-templates" / recipe / "rootfs"
    assert rootfs.is_dir(), f"the shared {recipe} build failed:\n{log[-3000:]}"
    return Built(home / "data", rootfs, log, seconds)


def _build(recipe: str, home: Path, timeout: float) -> None:
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(mode=0o755, parents=True)
    for directory in (home, home.parent):
        directory.chmod(0o755)
    started = time.monotonic()
    build = subprocess.run(
        [RINGFENCE, "template", "build", recipe, "--recipe", recipe,
         "--data-dir", str(home / "data")],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    seconds = time.monotonic() - started
    log = build.stderr if build.returncode == 0 else f"exit {build.returncode}\n{build.stderr}"
    (home / "done").write_text(f"{seconds:.1f}\n{log}")


def release() -> None:
    """At the end of a worker's session: let go of its run, and remove the run's templates
    if no other worker of it still holds it."""
    for run, alive in list(_alive.items()):
        fcntl.flock(alive, fcntl.LOCK_UN)
        try:
            fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            alive.close()  # another worker still runs: the last one cleans up
        else:
            shutil.rmtree(ROOT / run, ignore_errors=True)
            for leftover in ROOT.glob(f"{run}-*.lock"):
                leftover.unlink(missing_ok=True)
            (ROOT / f"{run}.alive").unlink(missing_ok=True)
            alive.close()
        del _alive[run]


def _hold_alive(run: str) -> None:
    if run not in _alive:
        alive = open(ROOT / f"{run}.alive", "w")  # noqa: SIM115 - held for the process's life
        fcntl.flock(alive, fcntl.LOCK_SH)
        _alive[run] = alive


def _sweep(run: str) -> None:
    """Remove the templates of other runs nobody holds alive any more."""
    for alive in ROOT.glob("*.alive"):
        other = alive.name.removesuffix(".alive")
        if other == run:
            continue
        with open(alive, "a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a run still going
            shutil.rmtree(ROOT / other, ignore_errors=True)
            for leftover in ROOT.glob(f"{other}-*.lock"):
                leftover.unlink(missing_ok=True)
            alive.unlink(missing_ok=True)
