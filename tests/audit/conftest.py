"""An audit log on SQLite in a temporary data directory, and its export by the CLI."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.audit._log import append, events, ringfence


def _make_log(directory: Path) -> Path:
    append(directory, events("acme", 5), seal=True)
    append(directory, events("beta", 5, start=5), seal=True)
    append(directory, events("acme", 3, start=10))
    return directory


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data directory whose log holds, by seq: 1-5 records, 6 a seal, 7-11 records, 12 a
    seal, 13-15 records (an export adds its seal as 16)."""
    return _make_log(tmp_path / "data")


@dataclass(frozen=True)
class _Sealed:
    export: Path
    public_key: str


@pytest.fixture(scope="module")
def _sealed(tmp_path_factory: pytest.TempPathFactory) -> _Sealed:
    """One log and its export for a module's tests to copy: the CLI takes a second or two."""
    root = tmp_path_factory.mktemp("sealed")
    directory = _make_log(root / "data")
    export = root / "audit.jsonl"
    run = ringfence("audit", "export", "--out", export, "--data-dir", directory)
    assert run.code == 0, run.stderr
    key = ringfence("audit", "public-key", "--data-dir", directory)
    assert key.code == 0, key.stderr
    return _Sealed(export, key.stdout.strip())


@pytest.fixture
def exported(_sealed: _Sealed, tmp_path: Path) -> Path:
    """A copy of ``ringfence audit export`` of a log like ``data_dir``'s: 16 lines, seals at
    6, 12 and 16. Tamper with it at will."""
    copy = tmp_path / "audit.jsonl"
    shutil.copy2(_sealed.export, copy)
    return copy


@pytest.fixture
def pinned_key(_sealed: _Sealed) -> str:
    """The key that sealed ``exported``, as ``ringfence audit public-key`` printed it."""
    return _sealed.public_key
