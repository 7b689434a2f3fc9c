"""A project view as the local runtime makes one, without a sandbox: an overlay whose
lower layer is the host directory and whose upper layer is on a tmpfs of its own, mounted
by the test (root), ``userxattr`` like an overlay mounted in a sandbox's user namespace."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class View:
    host: Path  # the project directory on the host
    upper: Path  # the overlay's upper layer (what diff and sync read)
    merged: Path  # what the sandbox would see
    outside: Path  # a directory beside the project that nothing may reach


@pytest.fixture
def view(tmp_path: Path) -> Iterator[View]:
    if os.geteuid() != 0:
        pytest.skip("mounting an overlay needs root")
    host, layer, merged, outside = (tmp_path / n for n in ("host", "layer", "merged", "outside"))
    for directory in (host, layer, merged, outside):
        directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(layer)], check=True)
    (layer / "upper").mkdir()
    (layer / "work").mkdir()
    options = f"lowerdir={host},upperdir={layer / 'upper'},workdir={layer / 'work'},userxattr"
    try:
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
                       check=True)  # fmt: skip
        try:
            yield View(host, layer / "upper", merged, outside)
        finally:
            subprocess.run(["umount", "-l", str(merged)], check=True)
    finally:
        subprocess.run(["umount", "-l", str(layer)], check=True)


def remount(view: View) -> None:
    """Drop the overlay's caches of the host directory (a change made on the host behind a
    mounted overlay is undefined; tests that change the host mid-way remount first)."""
    subprocess.run(["mount", "-o", "remount", str(view.merged)], check=True)
