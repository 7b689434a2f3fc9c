"""One host uid per live sandbox: the allocator's books, the host-wide claims, the settings."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ringfence.backends.local.probe import check_host, uid_range_clash
from ringfence.backends.local.uids import _FLOCK, UidAllocator, UidClaims, drop_privileges
from ringfence.config import DEFAULT_SANDBOX_UIDS, Config
from ringfence.errors import HTTP_STATUS, SandboxUidsExhausted


def test_each_live_sandbox_gets_a_uid_of_its_own() -> None:
    uids = UidAllocator(100, 102)
    taken = [uids.acquire() for _ in range(3)]
    assert taken == [100, 101, 102]
    assert uids.in_use == {100, 101, 102}


def test_an_exhausted_range_refuses_instead_of_sharing() -> None:
    uids = UidAllocator(100, 101)
    uids.acquire()
    uids.acquire()
    with pytest.raises(SandboxUidsExhausted) as refused:
        uids.acquire()
    assert refused.value.code == "sandbox_uids_exhausted"
    assert HTTP_STATUS[refused.value.code] == 503
    with pytest.raises(SandboxUidsExhausted):
        uids.check_free()
    assert uids.in_use == {100, 101}


def test_a_released_uid_comes_back_as_late_as_possible() -> None:
    uids = UidAllocator(100, 103)
    first, second = uids.acquire(), uids.acquire()
    uids.release(first)
    uids.check_free()
    # Never-used uids go first, then the one released longest ago.
    assert uids.acquire() == 102
    assert uids.acquire() == 103
    uids.release(second)
    assert uids.acquire() == first
    assert uids.acquire() == second
    with pytest.raises(SandboxUidsExhausted):
        uids.acquire()


def test_a_uid_held_elsewhere_is_skipped_and_tried_last() -> None:
    uids = UidAllocator(100, 102)
    held_elsewhere = {100}
    assert uids.acquire(lambda uid: uid not in held_elsewhere) == 101
    held_elsewhere.clear()
    assert uids.acquire() == 102
    assert uids.acquire() == 100, "the skipped uid was kept"


def test_a_failing_claim_loses_no_uid() -> None:
    uids = UidAllocator(100, 100)

    def broken(uid: int) -> bool:
        raise OSError("no lock for you")

    with pytest.raises(OSError):
        uids.acquire(broken)
    assert uids.acquire() == 100


def test_only_a_uid_handed_out_can_be_released() -> None:
    uids = UidAllocator(100, 101)
    with pytest.raises(KeyError):
        uids.release(100)
    with pytest.raises(ValueError):
        UidAllocator(0, 10)
    with pytest.raises(ValueError):
        UidAllocator(10, 9)


def test_two_claimants_on_one_host_never_hold_the_same_uid(tmp_path: Path) -> None:
    """Two servers on one host (two open file descriptions of one claims file; a second
    process conflicts the same way) never hand out the same uid."""
    one, two = UidClaims(tmp_path / "claims"), UidClaims(tmp_path / "claims")
    try:
        assert one.claim(2_000_000_000)
        assert not two.claim(2_000_000_000)
        assert two.claim(2_000_000_001), "other uids stay free"
        one.release(2_000_000_000)
        assert two.claim(2_000_000_000)
        assert not one.claim(2_000_000_000)
        two.close()  # a server that dies drops every claim with its descriptor
        assert one.claim(2_000_000_000) and one.claim(2_000_000_001)
    finally:
        one.close()
        two.close()


def test_another_process_cannot_claim_a_uid_held_here(tmp_path: Path) -> None:
    claims = UidClaims(tmp_path / "claims")
    try:
        assert claims.claim(2_000_000_005)
        script = (
            "import sys; from pathlib import Path; "
            "from ringfence.backends.local.uids import UidClaims; "
            "c = UidClaims(Path(sys.argv[1])); "
            "print(c.claim(2_000_000_005), c.claim(2_000_000_006))"
        )
        other = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "claims")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert other.stdout.split() == ["False", "True"]
    finally:
        claims.close()


def test_allocators_on_one_host_skip_each_others_uids(tmp_path: Path) -> None:
    claims = [UidClaims(tmp_path / "claims") for _ in range(2)]
    books = [UidAllocator(100, 103) for _ in range(2)]
    try:
        taken = [books[i % 2].acquire(claims[i % 2].claim) for i in range(4)]
        assert sorted(taken) == [100, 101, 102, 103]
        with pytest.raises(SandboxUidsExhausted):
            books[0].acquire(claims[0].claim)
    finally:
        for claim in claims:
            claim.close()


def test_the_lock_record_is_a_struct_flock() -> None:
    assert struct.calcsize(_FLOCK) == 32  # sizeof(struct flock) on 64-bit Linux


def test_privileges_drop_to_the_sandbox_uid_and_its_gid() -> None:
    assert drop_privileges("/usr/bin/setpriv", 2_000_000_007) == (
        "/usr/bin/setpriv",
        "--reuid=2000000007",
        "--regid=2000000007",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    )
    assert drop_privileges(None, 1000) == ()


def test_the_default_range_is_clear_of_users_and_subordinate_ranges() -> None:
    first, last = Config().sandbox_uids
    assert f"{first}-{last}" == DEFAULT_SANDBOX_UIDS
    assert last - first + 1 == 65536
    assert 600_100_000 < 1_879_048_191 < first and last < 2**31  # subuid, systemd containers
    useradd_defaults = "alice:100000:65536\nbob:165536:65536\n"
    root, root_group = "root:x:0:0::/root:/bin/sh\n", "root:x:0:\n"
    tables = {"subuid": useradd_defaults, "subgid": useradd_defaults}
    assert _clash(first, last, passwd=root, group=root_group, **tables) is None


def _clash(first: int, last: int, **tables: str) -> str | None:
    return uid_range_clash(
        first, last, **{"passwd": "", "group": "", "subuid": "", "subgid": "", **tables}
    )


def test_a_range_that_overlaps_a_user_or_a_subordinate_range_is_named() -> None:
    passwd = "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n"
    subuid = "alice:100000:65536\n"
    assert "alice" in (_clash(1000, 1000, passwd=passwd) or "")
    assert "100000-165535" in (_clash(165535, 170000, passwd=passwd, subuid=subuid) or "")
    assert _clash(165536, 170000, passwd=passwd, subuid=subuid) is None
    assert _clash(64000, 64999, passwd=passwd, subuid=subuid) is None


def test_a_range_that_overlaps_a_group_or_a_subordinate_gid_range_is_named() -> None:
    # A sandbox runs as gid N too: a group of that gid (its members' processes) or a
    # subordinate gid range (rootless containers) shares the sandbox's gid, its files.
    group = "root:x:0:\ndevs:x:5000:alice\n"
    assert "group 'devs' has gid 5000" in (_clash(4000, 6000, group=group) or "")
    subgid = "alice:300000:65536\n"
    assert "subordinate gids 300000-365535" in (_clash(365535, 400000, subgid=subgid) or "")
    assert _clash(365536, 400000, group=group, subgid=subgid) is None


def test_the_range_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGFENCE_SANDBOX_UID_RANGE", " 64000-64999 ")
    assert Config().sandbox_uids == (64000, 64999)
    for bad in ("64000", "a-b", "0-10", "10-9", "1-4294967295", "-5-7"):
        monkeypatch.setenv("RINGFENCE_SANDBOX_UID_RANGE", bad)
        with pytest.raises(ValidationError, match="sandbox_uid_range"):
            Config()


@pytest.mark.parametrize("name", ["RINGFENCE_SANDBOX_UID", "RINGFENCE_SANDBOX_GID"])
def test_the_old_single_uid_settings_are_refused_with_what_replaced_them(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "64000")
    with pytest.raises(ValidationError, match="RINGFENCE_SANDBOX_UID_RANGE"):
        Config()


def test_a_test_sandbox_that_hangs_is_a_failed_check_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = subprocess.run

    def hangs(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if "--args" not in argv:  # bwrap --version, not the test sandbox
            return run(argv, **kwargs)
        raise subprocess.TimeoutExpired(argv, 30)

    monkeypatch.setattr(subprocess, "run", hangs)  # probe calls subprocess.run
    checks, host = check_host(Config())
    namespaces = [check for check in checks if check.layer == "namespaces"]
    assert host is None
    assert len(namespaces) == 1 and not namespaces[0].ok
    assert "did not exit within 30 s" in namespaces[0].detail
