"""The cgroup v2 code on the kernel's real unified hierarchy.

Hosts here are v1/v2 hybrids: the unified hierarchy has no controllers, so limits cannot be
set on it, but moving, listing, killing (``cgroup.kill``) and removing can run for real.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringfence.backends.local.cgroups import (
    _V2Cgroup,
    instance_name,
    parse_mountinfo,
    parse_proc_cgroup,
    sweep_stale_instances,
)


@pytest.fixture
def unified_cgroup() -> Iterator[Path]:
    mounts = [
        m
        for m in parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        if m.fstype == "cgroup2"
    ]
    assert mounts, "this machine mounts cgroup2 (at /sys/fs/cgroup/unified or /sys/fs/cgroup)"
    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text()).get("", "/")
    directory = Path(mounts[0].mountpoint + own) / f"ringfence-v2-test-{os.getpid()}"
    directory.mkdir()
    yield directory
    if directory.exists():
        directory.rmdir()


async def test_v2_cgroup_moves_lists_kills_and_removes(unified_cgroup: Path) -> None:
    cgroup = _V2Cgroup(unified_cgroup)
    # A parent that forks once it is inside: every descendant must be found and killed.
    tree = subprocess.Popen(
        ["sh", "-c", "read go; sleep 60 & sleep 60 & wait"], stdin=subprocess.PIPE
    )
    assert tree.stdin is not None
    try:
        assert cgroup.add(tree.pid)
        tree.stdin.write(b"go\n")
        tree.stdin.close()
        for _ in range(500):
            if len(cgroup.pids()) == 3:
                break
            await asyncio.sleep(0.01)
        assert len(cgroup.pids()) == 3 and tree.pid in cgroup.pids()
        cgroup.remove()
        assert tree.wait(timeout=5) == -9
        assert not unified_cgroup.exists()
    finally:
        tree.kill()
        tree.wait()


def test_adding_a_process_that_exited_reports_false(unified_cgroup: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert _V2Cgroup(unified_cgroup).add(gone.pid) is False


def test_a_new_instance_sweeps_the_cgroups_of_a_dead_one(tmp_path: Path) -> None:
    # Real processes, and directories standing in for cgroups: the sweep is file operations.
    group = tmp_path / "ringfence"
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = group / instance_name(os.getpid())
    stale = group / instance_name(dead.pid)
    for directory in (alive / "rf-live", stale / "rf-left"):
        directory.mkdir(parents=True)
    sweep_stale_instances(group)
    assert not stale.exists()
    assert (alive / "rf-live").exists(), "a running instance's cgroups are left alone"
