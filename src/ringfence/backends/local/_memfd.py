"""Data handed to bwrap through file descriptors."""

from __future__ import annotations

import os

__all__ = ["memfd_with"]


def memfd_with(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, positioned at its start. Close it after
    the child started: the child reads its own copy of the descriptor."""
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
