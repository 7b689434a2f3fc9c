"""Freezing and thawing real cgroups (v1's freezer hierarchy and v2's ``cgroup.freeze``) with
real processes looping in them: a frozen one stops advancing at once, a thawed one resumes,
a frozen one can still be killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ringfence.backends.local.cgroups import (
    FREEZER,
    Cgroup,
    V1Driver,
    _V1Cgroup,
    _V2Cgroup,
    detect,
    parse_mountinfo,
    parse_proc_cgroup,
)
from ringfence.errors import StateUnsupported
from ringfence.models import ResourceLimits

# Two processes (a parent and the child it forks), each bumping its own counter file as fast
# as it can: both must stop, not just the one that was in the cgroup first.
LOOPER = """
import os, sys
where = sys.argv[2]
name = "parent" if os.fork() else "child"
fd = os.open(os.path.join(where, name), os.O_RDWR | os.O_CREAT, 0o600)
n = 0
while True:
    n += 1
    os.pwrite(fd, n.to_bytes(8, "little"), 0)
"""
QUIET_SECONDS = 0.05  # how long a frozen counter is watched for not moving


def _mount(fstype: str, option: str | None = None) -> tuple[Path, str]:
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    for m in mounts:
        if m.fstype == fstype and (option is None or option in m.options):
            return Path(m.mountpoint), own.get(option or "", "/")
    pytest.fail(f"this machine mounts {fstype} {option or ''} (see tests/README.md)")


def _test_dir(fstype: str, option: str | None = None) -> Path:
    mountpoint, own = _mount(fstype, option)
    directory = Path(str(mountpoint) + own) / f"ringfence-freezer-test-{os.getpid()}"
    directory.mkdir()
    return directory


@pytest.fixture
def v1_cgroup() -> Iterator[_V1Cgroup]:
    dirs = {FREEZER: _test_dir("cgroup", FREEZER), "pids": _test_dir("cgroup", "pids")}
    cgroup = _V1Cgroup(dirs)
    yield cgroup
    cgroup.remove()


@pytest.fixture
def v2_cgroup() -> Iterator[_V2Cgroup]:
    cgroup = _V2Cgroup(_test_dir("cgroup2"))
    yield cgroup
    cgroup.remove()


def _counters(where: Path) -> dict[str, int]:
    return {
        name: int.from_bytes((where / name).read_bytes()[:8] or b"\0", "little")
        for name in ("parent", "child")
        if (where / name).exists()
    }


def _wait_for(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def _advancing(where: Path) -> bool:
    if not _wait_for(lambda: len(_counters(where)) == 2):
        return False
    before = _counters(where)
    return _wait_for(lambda: all(v > before[k] for k, v in _counters(where).items()))


@pytest.fixture
def looper(tmp_path: Path) -> Iterator[Callable[[Cgroup], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(cgroup: Cgroup) -> subprocess.Popen[bytes]:
        # Held at a read until it is inside, so its fork lands in the cgroup too.
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; sys.stdin.readline(); exec(sys.argv[1])",
                LOOPER,
                str(tmp_path),
            ],
            stdin=subprocess.PIPE,
        )
        started.append(proc)
        assert cgroup.add(proc.pid)
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert _wait_for(lambda: len(cgroup.pids()) == 2)
        assert _advancing(tmp_path)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _check_freeze_stops_every_task_and_thaw_resumes_them(
    cgroup: Cgroup, start: Callable[[Cgroup], subprocess.Popen[bytes]], where: Path
) -> None:
    start(cgroup)
    assert cgroup.can_freeze and not cgroup.is_frozen()
    for _ in range(3):  # again and again: a second freeze of the same cgroup works as well
        cgroup.freeze()
        assert cgroup.is_frozen()
        stopped = _counters(where)
        time.sleep(QUIET_SECONDS)  # a window to watch, not an ordering
        assert _counters(where) == stopped, "a task ran after freeze() returned"
        cgroup.thaw()
        assert not cgroup.is_frozen()
        assert _advancing(where)


def test_v1_freeze_stops_every_task_and_thaw_resumes_them(
    v1_cgroup: _V1Cgroup, looper: Callable[[Cgroup], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    _check_freeze_stops_every_task_and_thaw_resumes_them(v1_cgroup, looper, tmp_path)


def test_v2_freeze_stops_every_task_and_thaw_resumes_them(
    v2_cgroup: _V2Cgroup, looper: Callable[[Cgroup], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    _check_freeze_stops_every_task_and_thaw_resumes_them(v2_cgroup, looper, tmp_path)


@pytest.mark.parametrize("version", [1, 2])
def test_a_frozen_sandbox_can_be_killed(
    version: int,
    v1_cgroup: _V1Cgroup,
    v2_cgroup: _V2Cgroup,
    looper: Callable[[Cgroup], subprocess.Popen[bytes]],
) -> None:
    cgroup: Cgroup = v1_cgroup if version == 1 else v2_cgroup
    proc = looper(cgroup)
    cgroup.freeze()
    cgroup.kill_all()
    assert cgroup.pids() == []
    assert proc.wait(timeout=5) == -9


def test_the_frozen_block_thaws_even_when_it_raises(
    v2_cgroup: _V2Cgroup, looper: Callable[[Cgroup], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    looper(v2_cgroup)
    with pytest.raises(RuntimeError), v2_cgroup.frozen():
        assert v2_cgroup.is_frozen()
        raise RuntimeError("the snapshot failed")
    assert not v2_cgroup.is_frozen()
    assert _advancing(tmp_path)


def test_an_empty_cgroup_freezes_and_thaws(v1_cgroup: _V1Cgroup, v2_cgroup: _V2Cgroup) -> None:
    for cgroup in (v1_cgroup, v2_cgroup):
        with cgroup.frozen():
            assert cgroup.is_frozen()
        cgroup.thaw()  # thawing a thawed cgroup is a no-op


def test_a_v1_host_without_a_freezer_runs_sandboxes_that_cannot_be_frozen(
    tmp_path: Path,
) -> None:
    # Plain directories stand in for the memory, pids and cpu hierarchies (no freezer one).
    groups = {c: tmp_path / c for c in ("memory", "pids", "cpu")}
    for directory in groups.values():
        directory.mkdir()
    driver = V1Driver(groups)
    assert not driver.can_freeze
    limits = ResourceLimits(memory=64 << 20, pids=32, cpus=0.5, disk=8 << 20)
    cgroup = driver.create("rf-1", limits)
    assert not cgroup.can_freeze and not cgroup.is_frozen()
    with pytest.raises(StateUnsupported) as exc:
        cgroup.freeze()
    assert exc.value.code == "state_unsupported"
    cgroup.thaw()  # nothing to thaw: no error


def test_the_v1_driver_puts_sandboxes_in_the_freezer_when_the_host_has_one() -> None:
    driver = detect()
    assert isinstance(driver, V1Driver), "this machine is a v1/v2 hybrid (see tests/README.md)"
    assert driver.can_freeze
    limits = ResourceLimits(memory=64 << 20, pids=32, cpus=0.5, disk=8 << 20)
    cgroup = driver.create(f"rf-freezer-test-{os.getpid()}", limits)
    try:
        assert cgroup.can_freeze
        with cgroup.frozen():
            assert cgroup.is_frozen()
    finally:
        cgroup.remove()
