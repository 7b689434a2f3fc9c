"""Files a sandbox's processes map shared and writable: their changes move no ctime.

tmpfs never writes back, so a page of a ``MAP_SHARED`` writable mapping stays writable
after its first write fault, and later stores through it change the file without a fault,
hence without ``file_update_time``: ctime, mtime and size stay what they were. The
incremental test (inode, ctime, size) would call such a file unchanged. While the
sandbox is frozen its processes and their mappings cannot change, so the inodes read here
from ``/proc/<pid>/maps`` are every file that may have changed that way: a checkpoint
copies them, a rollback rewrites them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from ringfence.errors import SandboxError

Inode = tuple[int, int]  # st_dev, st_ino
Pids = Callable[[], Iterable[int]]


def shared_writable(pids: Pids | None) -> frozenset[Inode]:
    """The (device, inode) of every file mapped shared and writable by the processes
    ``pids()`` gives (the sandbox's cgroup, frozen). A process that exited meanwhile maps
    nothing; any other failure to read one is ``SandboxError`` (fail closed: a file it
    maps could be missed)."""
    if pids is None:
        return frozenset()
    found: set[Inode] = set()
    for pid in pids():
        try:
            with open(f"/proc/{int(pid)}/maps", encoding="ascii", errors="replace") as maps:
                lines = maps.read().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError as exc:
            raise SandboxError(f"cannot read the mappings of process {pid}: {exc}") from exc
        for line in lines:
            inode = _shared_writable_file(line)
            if inode is not None:
                found.add(inode)
    return frozenset(found)


def _shared_writable_file(line: str) -> Inode | None:
    # address perms offset dev inode [path]; perms "rw-s": read, write, exec, shared
    fields = line.split(maxsplit=5)
    if len(fields) < 5:
        return None
    perms, dev, inode = fields[1], fields[3], fields[4]
    if len(perms) < 4 or perms[1] != "w" or perms[3] != "s" or inode == "0":
        return None
    major, _, minor = dev.partition(":")
    try:
        return os.makedev(int(major, 16), int(minor, 16)), int(inode)
    except ValueError:
        return None
