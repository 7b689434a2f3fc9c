"""``Cgroup.usage`` parses what the kernel writes, on v2 and v1, without privileges: the
files are laid out in a temporary directory as the kernel shows them (values taken from a
real cgroup of each kind). The readings of real sandboxes are tested in
tests/server/test_sandbox_metrics.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfence.backends.local.cgroups import CPUACCT, _V1Cgroup, _V2Cgroup
from ringfence.errors import SandboxError

MIB = 1 << 20


def _files(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)


def test_v2_usage_reads_cpu_memory_pids_and_limits(tmp_path: Path) -> None:
    _files(tmp_path, {
        "cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
        "memory.current": f"{64 * MIB}\n",
        "memory.stat": f"anon {40 * MIB}\nfile {24 * MIB}\nactive_file {8 * MIB}\n"
                       f"inactive_file {16 * MIB}\nshmem_file 0\n",
        "pids.current": "7\n",
        "cpu.max": "50000 100000\n",
        "memory.max": f"{512 * MIB}\n",
    })  # fmt: skip
    usage = _V2Cgroup(tmp_path).usage()
    assert usage.cpu_seconds == pytest.approx(2.5)
    assert usage.memory_bytes == 48 * MIB, "inactive file cache is not counted"
    assert usage.memory_cache_bytes == 24 * MIB
    assert (usage.pids, usage.memory_limit, usage.cpus) == (7, 512 * MIB, 0.5)


def test_v2_without_limits_says_none(tmp_path: Path) -> None:
    _files(tmp_path, {
        "cpu.stat": "usage_usec 0\n", "memory.current": "0\n", "memory.stat": "anon 0\n",
        "pids.current": "1\n", "cpu.max": "max 100000\n", "memory.max": "max\n",
    })  # fmt: skip
    usage = _V2Cgroup(tmp_path).usage()
    assert (usage.memory_limit, usage.cpus) == (0, 0.0)


def test_v1_usage_reads_each_hierarchy_and_limits_once(tmp_path: Path) -> None:
    dirs = {c: tmp_path / c for c in ("memory", "pids", "cpu", CPUACCT)}
    _files(dirs["memory"], {
        "memory.usage_in_bytes": f"{100 * MIB}\n",
        "memory.stat": f"cache {30 * MIB}\ninactive_file {99 * MIB}\n"
                       f"total_cache {30 * MIB}\ntotal_inactive_file {10 * MIB}\n",
        "memory.limit_in_bytes": f"{256 * MIB}\n",
    })  # fmt: skip
    _files(dirs["pids"], {"pids.current": "3\n"})
    _files(dirs["cpu"], {"cpu.cfs_quota_us": "200000\n", "cpu.cfs_period_us": "100000\n"})
    _files(dirs[CPUACCT], {"cpuacct.usage": "1500000000\n"})
    cgroup = _V1Cgroup(dirs)
    usage = cgroup.usage()
    assert usage.cpu_seconds == pytest.approx(1.5)
    assert usage.memory_bytes == 90 * MIB, "the hierarchical total_ key, not the local one"
    assert usage.memory_cache_bytes == 30 * MIB
    assert (usage.pids, usage.memory_limit, usage.cpus) == (3, 256 * MIB, 2.0)
    (dirs["memory"] / "memory.limit_in_bytes").write_text("1\n")
    assert cgroup.usage().memory_limit == 256 * MIB, "limits are read once"


def test_v1_without_cpuacct_or_a_memory_limit(tmp_path: Path) -> None:
    dirs = {c: tmp_path / c for c in ("memory", "pids", "cpu")}
    _files(dirs["memory"], {
        "memory.usage_in_bytes": "0\n", "memory.stat": "total_cache 0\n",
        "memory.limit_in_bytes": "9223372036854771712\n",  # the kernel's "no limit"
    })  # fmt: skip
    _files(dirs["pids"], {"pids.current": "1\n"})
    _files(dirs["cpu"], {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})
    usage = _V1Cgroup(dirs).usage()
    assert usage.cpu_seconds is None and usage.memory_limit == 0 and usage.cpus == 0.0
    assert not _V1Cgroup(dirs).accounts_cpu


def test_a_removed_cgroup_is_a_sandbox_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError):
        _V2Cgroup(tmp_path / "gone").usage()


def test_proc_readings_of_processes_and_a_tree(tmp_path: Path) -> None:
    import os

    from ringfence.backends.proc_usage import cpu_seconds_of, disk_bytes_of, resident_bytes_of

    sum(range(2_000_000))  # some CPU time of our own
    assert cpu_seconds_of([os.getpid(), 999_999_999]) > 0, "a pid gone is skipped"
    assert resident_bytes_of([os.getpid()]) > MIB
    (tmp_path / "a").write_bytes(b"x" * (MIB))
    os.link(tmp_path / "a", tmp_path / "hard")  # counted once
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"y" * (4 * MIB))
    os.symlink(outside, tmp_path / "link")  # never followed
    assert MIB <= disk_bytes_of(tmp_path) < 2 * MIB


_SET_NAME = """
import ctypes, sys
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"\\xff) 1 2 (\\xfe"), 0, 0, 0)  # PR_SET_NAME
sum(range(3_000_000))
print("named", flush=True)
sys.stdin.read()
"""


def test_proc_cpu_time_survives_a_process_named_with_any_bytes() -> None:
    """A process names itself with bytes that are not UTF-8 and hold ``)``: its record is
    still read (its CPU time counted), and no reading fails for the sandbox."""
    import subprocess
    import sys

    from ringfence.backends.proc_usage import cpu_seconds_of

    child = subprocess.Popen(
        [sys.executable, "-c", _SET_NAME], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"named\n"
        assert Path(f"/proc/{child.pid}/comm").read_bytes().startswith(b"\xff)")
        assert cpu_seconds_of([child.pid]) > 0
    finally:
        child.kill()
        child.wait(timeout=10)


def test_proc_readings_read_at_most_their_limit_of_pids() -> None:
    import itertools
    import os
    from collections.abc import Iterator

    from ringfence.backends.proc_usage import cpu_seconds_of, resident_bytes_of

    pulled = 0

    def pids() -> Iterator[int]:
        nonlocal pulled
        for pid in itertools.repeat(os.getpid()):
            pulled += 1
            yield pid

    assert cpu_seconds_of(pids(), limit=5) > 0 and pulled == 5
    pulled = 0
    assert resident_bytes_of(pids(), limit=3) > 0 and pulled == 3


@pytest.mark.parametrize("accounts_cpu", [True, False])
def test_a_reading_without_cpu_accounting_runs_off_the_event_loop(accounts_cpu: bool) -> None:
    """Counting CPU time from /proc is a read per process: it goes to a thread, while a
    reading of kernel counters stays on the loop (cheaper than a hop)."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from ringfence.backends.local.sandbox import LocalSandbox

    threads: list[threading.Thread] = []
    parts = SimpleNamespace(cgroup=SimpleNamespace(accounts_cpu=accounts_cpu))
    stub = SimpleNamespace(
        _cgroup_parts=lambda: parts,
        _check_running=lambda: None,
        _usage=lambda _parts: threads.append(threading.current_thread()) or "read",
    )
    assert asyncio.run(LocalSandbox.usage(stub)) == "read"  # type: ignore[arg-type]
    assert (threads[0] is threading.main_thread()) is accounts_cpu
