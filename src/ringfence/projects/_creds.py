"""Running a function as a project directory's owner for the filesystem, in a thread of
its own.

The server is root; a sync must do no more to the host directory than its owner could:
create files that belong to the owner, and never remove, replace or write what the owner
may not (a directory of another user inside the project stays that user's). Linux keeps
credentials per thread, so a short-lived thread takes the owner's filesystem uid and gid
and that gid alone as its groups (``setgroups`` by raw syscall: glibc's wrapper changes
every thread of the process), and keeps of root's capabilities only
``CAP_DAC_READ_SEARCH``: it reads the sandbox's upper layer (files of the sandbox's ids)
and traverses directories, but writes only where the owner's permissions let it. The
server's other threads never change; the thread's credentials die with it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

CAP_DAC_READ_SEARCH = 2
_CAP_VERSION_3 = 0x20080522
_SETGROUPS = {"x86_64": 116, "aarch64": 159}
_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def run_as_owner(uid: int, gid: int, fn: Callable[[], T]) -> T:
    """``fn()`` in a new thread whose filesystem ids are ``uid``/``gid``, whose only group
    is ``gid`` and whose only capability is ``CAP_DAC_READ_SEARCH``; its result, or its
    exception. Not root (tests as an ordinary user): ``fn()`` runs with that user's own
    rights in the thread, nothing changed."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            if os.geteuid() == 0:
                _take_ids(uid, gid)
            outcome.append(fn())
        except BaseException as exc:  # handed to the caller's thread, raised there
            failure.append(exc)

    thread = threading.Thread(target=body, name="ringfence-project")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def _take_ids(uid: int, gid: int) -> None:
    number = _SETGROUPS.get(platform.machine())
    if number is None:
        raise OSError(f"setgroups: unsupported machine {platform.machine()}")
    groups = (ctypes.c_uint32 * 1)(gid)
    if _libc.syscall(number, 1, groups) != 0:
        raise OSError(ctypes.get_errno(), f"setgroups: {os.strerror(ctypes.get_errno())}")
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    # Both return the previous id and report no error: asking again reads the current one.
    if _libc.setfsuid(uid) != uid or _libc.setfsgid(gid) != gid:
        raise PermissionError(f"cannot take the filesystem ids {uid}:{gid}")
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    for i, half in enumerate(data):
        wanted = ((1 << CAP_DAC_READ_SEARCH) >> (32 * i)) & 0xFFFFFFFF
        half.permitted &= wanted
        half.effective = half.permitted
        half.inheritable = 0
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
