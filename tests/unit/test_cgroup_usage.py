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
