"""Running a function as the sandbox's root for the filesystem, in a thread of its own.

Creating a name through a sandbox's overlay (even a rename onto it) needs a caller whose
fsuid and fsgid the overlay's user namespace maps (``may_create``: EOVERFLOW for host root).
Linux keeps credentials per thread, and glibc's ``setfsuid``/``setfsgid`` change the calling
thread's only, so a short-lived thread takes the sandbox's host id for the filesystem and
keeps, of host root's capabilities, only those a rollback of the sandbox's own files needs
(``KEPT``), in its effective and permitted sets alike: whatever the view it walks resolves
to, it can do little more than the sandbox's ids could. The server's other threads never
change; the thread's credentials die with it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

_CAP_VERSION_3 = 0x20080522
CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_MKNOD = 0, 1, 3, 4, 27
KEPT = {
    # give entries the sandbox's two ids (its root's and its user's)
    CAP_CHOWN: "chown",
    # read snapshot entries and write live ones whatever mode the sandbox gave them (0000
    # directories included); the walks refuse mounts, so only the sandbox's files are reached
    CAP_DAC_OVERRIDE: "dac_override",
    # set the mode, times and user.* xattrs of entries owned by the sandbox's other id
    CAP_FOWNER: "fowner",
    # keep a setgid bit of a file whose group is the sandbox's other id
    CAP_FSETID: "fsetid",
    # make overlay whiteouts (char 0:0)
    CAP_MKNOD: "mknod",
}
"""Dropped: CAP_SYS_ADMIN and the rest (trusted.* xattrs, which a ``userxattr`` overlay's
upper never holds, cannot be written then: such a rollback fails, closed)."""


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
    """``fn()`` in a new thread whose filesystem ids are ``uid``/``gid`` and whose only
    capabilities are ``KEPT``; its result, or its exception."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            _set_fs_ids(uid, gid)
            _keep_only(KEPT)
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


def _keep_only(caps: Iterable[int]) -> None:
    """This thread's effective and permitted capabilities become ``caps`` (those of them it
    holds; the kernel dropped the effective ones when the fsuid left 0), inheritable none."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    mask = sum(1 << cap for cap in caps)
    for i, half in enumerate(data):
        wanted = (mask >> (32 * i)) & 0xFFFFFFFF
        half.permitted &= wanted
        half.effective = half.permitted
        half.inheritable = 0
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
