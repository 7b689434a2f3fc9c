"""Test harness.

Attack tests run fork bombs, memory hogs and disk fillers. Before any test runs, the test
process moves itself into a cgroup of its own with a cap on tasks and memory, so a broken
defence fails one test instead of freezing the machine (sandbox cgroups nest under it).
Under pytest-xdist each worker does the same: its cgroup (named by its pid) nests under the
controller's, and each removes its own when it ends.

Which stores a test runs on: the fixtures in ``STORE_FIXTURES`` are parametrized over every
store they can serve from, but a test runs on the first (cheapest) one only, unless it is
marked ``every_store``. Logic is the same on every store, and each store is proven by the
conformance checks of tests/store (``ringfence.testing.store_checks``, on every store); the
tests marked ``every_store`` are the end-to-end set that keeps SQLite and PostgreSQL under
each capability (tests/README.md lists them by area).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ringfence.backends.local.cgroups import parse_mountinfo, parse_proc_cgroup
from ringfence.config import Config

HARNESS_PIDS = 4096
HARNESS_MEMORY = 6 << 30


def _cap_own_cgroup() -> list[Path]:
    if os.geteuid() != 0:
        return []
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    name = f"ringfence-tests-{os.getpid()}"
    v1 = {m.fstype: m for m in mounts}
    memory = next((m for m in mounts if m.fstype == "cgroup" and "memory" in m.options), None)
    pids = next((m for m in mounts if m.fstype == "cgroup" and "pids" in m.options), None)
    if memory and pids:
        placed = []
        for mount, controller, files in (
            (pids, "pids", {"pids.max": HARNESS_PIDS}),
            (memory, "memory", {"memory.limit_in_bytes": HARNESS_MEMORY}),
        ):
            directory = Path(mount.mountpoint + own.get(controller, "/")) / name
            _sweep_stale_harnesses(directory.parent)
            directory.mkdir(exist_ok=True)
            for filename, value in files.items():
                (directory / filename).write_text(str(value))
            (directory / "cgroup.procs").write_text(str(os.getpid()))
            placed.append(directory)
        return placed
    unified = v1.get("cgroup2")
    if unified is None:
        return []
    directory = Path(unified.mountpoint + own.get("", "/")) / name
    directory.mkdir(exist_ok=True)
    for filename, value in (("pids.max", HARNESS_PIDS), ("memory.max", HARNESS_MEMORY)):
        if (directory / filename).exists():
            (directory / filename).write_text(str(value))
    (directory / "cgroup.procs").write_text(str(os.getpid()))
    return [directory]


_HARNESS_KEY = pytest.StashKey[list[Path]]()

# Fixture name -> the store a test runs on unless it is marked ``every_store``. Each of these
# fixtures is parametrized over the stores it can serve from ("memory", "sqlite", "postgres").
STORE_FIXTURES = {
    "store": "memory",  # tests/server: the app in process
    "live": "sqlite",  # tests/server, tests/client: a server over real HTTP
    "server": "sqlite",  # tests/server/test_serve_process.py: ``ringfence serve`` itself
    "net_api": "sqlite",  # tests/network/test_api.py
    "ask_console": "sqlite",  # tests/console: egress asks through the console
}
EVERY_STORE = "every_store"
# A test (module, class) of logic marked ``fakes`` is served on the fakes of
# ``ringfence.testing.fakes`` by tests/server's ``api`` fixture, unless it is ``every_store``.
FAKES = "fakes"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{EVERY_STORE}: run on every store the test's fixtures serve from (SQLite and "
        "PostgreSQL too), not only the first: the end-to-end set of each capability",
    )
    config.addinivalue_line(
        "markers",
        f"{FAKES}: a test of logic: tests/server's ``api`` serves it on the fakes (no "
        f"isolation, no limits), unless it is marked {EVERY_STORE} (those keep real sandboxes)",
    )
    config.stash[_HARNESS_KEY] = _cap_own_cgroup()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the runs of unmarked tests on other stores than their fixture's first."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        params = getattr(item, "callspec", None)
        on = params.params if params is not None else {}
        chosen = {n for mark in item.iter_markers("parametrize") for n in _argnames(mark)}
        other = any(
            name in on and on[name] != first and name not in chosen
            for name, first in STORE_FIXTURES.items()
        )
        if other and item.get_closest_marker(EVERY_STORE) is None:
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _argnames(mark: pytest.Mark) -> list[str]:
    """The names a ``parametrize`` mark sets (a test that names its store keeps its choice)."""
    names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
    if isinstance(names, str):
        return [n.strip() for n in names.split(",")]
    return list(names)


def pytest_unconfigure(config: pytest.Config) -> None:
    for directory in config.stash.get(_HARNESS_KEY, []):
        # Back to the parent, then kill whatever a failed test left inside, and remove ours.
        (directory.parent / "cgroup.procs").write_text(str(os.getpid()))
        _remove_tree(directory)


def _remove_tree(directory: Path) -> None:
    for sub in sorted(directory.glob("**/"), key=lambda p: -len(p.parts)):
        for _ in range(1000):
            for pid in (sub / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            try:
                sub.rmdir()
                break
            except OSError:
                time.sleep(0.001)
        else:
            print(f"harness cgroup {sub} could not be removed")


def _sweep_stale_harnesses(parent: Path) -> None:
    for stale in parent.glob("ringfence-tests-*"):
        if not Path("/proc", stale.name.rsplit("-", 1)[1]).exists():
            _remove_tree(stale)


def pytest_report_header(config: pytest.Config) -> str:
    capped = config.stash.get(_HARNESS_KEY, [])
    if capped:
        where = ", ".join(map(str, capped))
        return f"harness cgroup: {where} (pids {HARNESS_PIDS}, memory {HARNESS_MEMORY >> 30}G)"
    return "harness cgroup: none (not root)"


@pytest.fixture(scope="session")
def local_host() -> object:
    """The local backend's host prerequisites, probed once per test session."""
    from ringfence.backends.local.probe import require

    return require(Config())


@pytest.fixture
async def local_executor(local_host: object) -> AsyncIterator[object]:
    """A fresh ``LocalExecutor`` (full isolation), closed after the test."""
    from ringfence.backends.local import LocalExecutor
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    executor = LocalExecutor(Config(), host=local_host)
    yield executor
    await executor.aclose()


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temporary directory the unprivileged sandbox user can traverse (pytest's is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="ringfence-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
