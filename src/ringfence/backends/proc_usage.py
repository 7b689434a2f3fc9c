"""What a set of processes and a directory use, read from ``/proc`` and the filesystem:
the fallbacks of backends without a cgroup to ask (the fake runtime), or without CPU
accounting in theirs (a cgroup v1 host with no cpuacct hierarchy). Each reads on request;
nothing is sampled. Processes that exit between the listing and the read are skipped."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["MAX_PIDS_READ", "cpu_seconds_of", "disk_bytes_of", "resident_bytes_of"]

MAX_PIDS_READ = 4096  # the most processes one reading reads (a sandbox's pids limit or so)

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds_of(pids: Iterable[int], limit: int = MAX_PIDS_READ) -> float:
    """The CPU time (user and system) the live processes ``pids`` have used, with that of
    their reaped children (what exited is lost unless its parent waited for it). At most
    ``limit`` of them are read (the rest are not counted: a reading must not cost a read
    per process of a fork bomb). A process's name is whatever it set (``PR_SET_NAME``,
    any bytes, even ``)``): the fields are taken as bytes after the last ``)``, and a
    record that does not parse is skipped, never an error."""
    ticks = 0
    for pid in itertools.islice(pids, limit):
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat_file:
                record = stat_file.read()
            # After the command's name: state is field 0; utime, stime, cutime, cstime 11..14.
            fields = record.rpartition(b")")[2].split()
            ticks += sum(int(value) for value in fields[11:15])
        except (OSError, ValueError):  # gone meanwhile, or not a stat record
            continue
    return ticks / _TICKS


def resident_bytes_of(pids: Iterable[int], limit: int = MAX_PIDS_READ) -> int:
    """The resident memory of the processes ``pids`` (shared pages counted in each), at
    most ``limit`` of them read."""
    pages = 0
    for pid in itertools.islice(pids, limit):
        try:
            with open(f"/proc/{pid}/statm", "rb") as statm:
                pages += int(statm.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return pages * _PAGE


def disk_bytes_of(root: Path) -> int:
    """The bytes the files under ``root`` occupy (allocated blocks; a hard link counted
    once), never following a symbolic link. Walks the tree: for small trees only."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            try:
                info = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total
