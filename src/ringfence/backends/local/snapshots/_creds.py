"""Running a function as the sandbox's root for the filesystem, in a thread of its own.

Creating a name through a sandbox's overlay (even a rename onto it) needs a caller whose
fsuid and fsgid the overlay's user namespace maps (``may_create``: EOVERFLOW for host root).
Linux keeps credentials per thread, and glibc's ``setfsuid``/``setfsgid`` change the calling
thread's only, so a short-lived thread takes the sandbox's host id for the filesystem and
puts back the capabilities the kernel drops from its effective set when an fsuid leaves 0
(it still holds them in its permitted set). The server's other threads never change; the
thread's credentials die with it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def run_as(uid: int, gid: int, fn: Callable[[], T]) -> T:
    """``fn()`` in a new thread whose filesystem ids are ``uid``/``gid`` (capabilities
    kept); its result, or its exception."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            _set_fs_ids(uid, gid)
            _restore_effective_caps()
            outcome.append(fn())
        except BaseException as exc:  # handed to the caller's thread, raised there
            failure.append(exc)

    thread = threading.Thread(target=body, name="ringfence-restore")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def _set_fs_ids(uid: int, gid: int) -> None:
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    # Both return the previous id and report no error: asking again reads the current one.
    if _libc.setfsuid(uid) != uid or _libc.setfsgid(gid) != gid:
        raise PermissionError(f"cannot take the filesystem ids {uid}:{gid}")


def _restore_effective_caps() -> None:
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    for half in data:
        half.effective = half.permitted
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
