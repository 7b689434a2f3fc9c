import os
from pathlib import Path

import pytest

from ringfence.backends.local.cgroups import (
    V2Driver,
    _delegate_v2,
    parse_mountinfo,
    parse_proc_cgroup,
    v1_limit_files,
    v2_limit_files,
)
from ringfence.errors import SandboxError
from ringfence.models import ResourceLimits

LIMITS = ResourceLimits(memory=64 << 20, pids=32, cpus=0.5, disk=8 << 20)

MOUNTINFO = """\
24 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup rw shared:9 - tmpfs tmpfs rw,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 31 0:30 / /sys/fs/cgroup/memory rw shared:14 - cgroup cgroup rw,memory
36 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw shared:15 - cgroup cgroup rw,cpu,cpuacct
37 31 0:32 /nested /sys/fs/cgroup/pids rw shared:16 - cgroup cgroup rw,pids
38 31 0:33 / /sys/fs/cgroup/with\\040space rw shared:17 - cgroup cgroup rw,freezer
"""


def test_mountinfo_parsing_finds_every_cgroup_mount_and_its_controllers() -> None:
    mounts = {m.mountpoint: m for m in parse_mountinfo(MOUNTINFO)}
    assert set(mounts) == {
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/cpu,cpuacct",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/with space",
    }
    assert mounts["/sys/fs/cgroup/unified"].fstype == "cgroup2"
    assert {"cpu", "cpuacct"} <= mounts["/sys/fs/cgroup/cpu,cpuacct"].options
    assert mounts["/sys/fs/cgroup/pids"].root == "/nested"


def test_proc_cgroup_parsing_maps_each_controller_to_its_path() -> None:
    paths = parse_proc_cgroup("12:pids:/a\n4:memory:/m/x\n3:cpu,cpuacct:/c\n0::/unified\n")
    assert paths == {"pids": "/a", "memory": "/m/x", "cpu": "/c", "cpuacct": "/c", "": "/unified"}


def test_v1_limits() -> None:
    assert dict(v1_limit_files(LIMITS)) == {
        "memory.limit_in_bytes": str(64 << 20),
        "memory.memsw.limit_in_bytes": str(64 << 20),
        "pids.max": "32",
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "50000",
    }


def test_v2_limits() -> None:
    assert dict(v2_limit_files(LIMITS)) == {
        "memory.max": str(64 << 20),
        "memory.swap.max": "0",
        "pids.max": "32",
        "cpu.max": "50000 100000",
    }


def test_tiny_cpu_shares_still_get_a_usable_quota() -> None:
    limits = LIMITS.model_copy(update={"cpus": 0.001})
    assert dict(v2_limit_files(limits))["cpu.max"] == "1000 100000"


def _fake_v2_tree(tmp_path: Path) -> Path:
    own = tmp_path / "own"
    own.mkdir()
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    return own


def test_v2_delegation_enables_the_controllers_for_the_ringfence_group(tmp_path: Path) -> None:
    own = _fake_v2_tree(tmp_path)
    group = _delegate_v2(own)
    assert group == own / "ringfence" / f"i{os.getpid()}"
    for level in (own, own / "ringfence", group):
        assert (level / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_v2_sandbox_cgroups_get_their_limits_and_report_oom(tmp_path: Path) -> None:
    # A plain directory stands in for cgroupfs: this checks which files get which values.
    group = tmp_path / "ringfence"
    group.mkdir()
    cgroup = V2Driver(group).create("rf-1", LIMITS)
    directory = group / "rf-1"
    assert (directory / "memory.max").read_text() == str(64 << 20)
    assert (directory / "pids.max").read_text() == "32"
    assert (directory / "cpu.max").read_text() == "50000 100000"
    assert not (directory / "memory.swap.max").exists(), "written only where the kernel has it"
    (directory / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cgroup.oom_kills() == 1
    (directory / "cgroup.procs").write_text("")
    assert cgroup.pids() == []


def test_creating_a_cgroup_that_cannot_be_written_is_a_sandbox_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError) as exc:
        V2Driver(tmp_path / "missing").create("rf-1", LIMITS)
    assert exc.value.code == "sandbox_error"
