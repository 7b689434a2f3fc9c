"""run_as: a thread of its own takes the sandbox's filesystem ids; the caller's never change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringfence.backends.local.snapshots._creds import KEPT, run_as

U = 61_234


def _make(path: Path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    return os.stat(path).st_uid


def test_files_made_in_the_thread_belong_to_the_sandbox_and_the_caller_stays_root(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: filesystem ids are changed")
    (tmp_path / "root-only").mkdir(mode=0o700)  # capabilities are kept: DAC still overridden
    assert run_as(U, U, lambda: _make(tmp_path / "root-only" / "made")) == U
    assert _make(tmp_path / "after") == 0


def test_an_exception_in_the_thread_reaches_the_caller() -> None:
    def fail() -> None:
        raise FileNotFoundError("gone")

    with pytest.raises(FileNotFoundError):
        run_as(U, U, fail)


def _capabilities() -> tuple[int, int]:
    with open("/proc/thread-self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return int(fields["CapEff"], 16), int(fields["CapPrm"], 16)


def test_the_thread_keeps_only_the_capabilities_a_rollback_needs() -> None:
    """Review I3: it had every capability of host root back in its effective set."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    effective, permitted = run_as(U, U, _capabilities)
    wanted = sum(1 << cap for cap in KEPT)
    assert effective == permitted == wanted
    assert not effective & (1 << 21)  # CAP_SYS_ADMIN
    assert _capabilities()[0] & (1 << 21)  # the caller's thread is unchanged


def test_the_thread_cannot_write_where_only_admin_could(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(PermissionError):
        run_as(U, U, lambda: os.setxattr(tmp_path / "f", "trusted.x", b"1"))
