"""Host uids (and gids) of their own for each live sandbox, from the operator's range.

Every limit the kernel keeps per uid is shared by all processes of that uid: inotify
instances and watches, ``RLIMIT_NPROC``, POSIX message-queue bytes, pending signals, pipe
buffers, user and other namespaces. Sandboxes of different tenants that shared one uid
could starve each other (one took all 128 inotify instances and another's file watch failed
with EMFILE), so each live sandbox runs as a host uid of its own, with the gid of the same
number, and no two live sandboxes ever share one. A one-shot execution takes one uid; an
interactive sandbox takes two (its root inside and its user: ``userns``), so the range
bounds live sandboxes at half its size when all are interactive: the default 65,536 uids
hold 32,768 interactive sandboxes, far above what one host's memory runs.

Two parts:

- ``UidAllocator`` (pure) keeps one process's books: it hands out uids never used first,
  then the one released longest ago, so a uid comes back as late as possible, and refuses
  with ``SandboxUidsExhausted`` when the range has none left, never sharing one.
- ``UidClaims`` makes a uid handed out here unavailable to every other Ringfence process on
  the host that uses the same runtime directory: an open-file-description lock on byte
  ``uid`` of one file. The kernel drops a process's claims with its descriptors, so a server
  that dies cannot leak them; two replicas on one host never hand out the same uid, even
  with overlapping ranges.

The backend gives a uid back only after its sandbox is gone: after the sandbox's cgroup was
removed, which the kernel allows only once no process is left in it. By then its mount
namespace (with its tmpfs files) and its descriptors (inotify instances included) are gone
too: they go before a dying process leaves its cgroup. A sandbox whose cleanup failed keeps
its uid for the life of the server.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ringfence.config import Config
from ringfence.errors import SandboxUidsExhausted

__all__ = ["CLAIMS_FILE", "SandboxUids", "UidAllocator", "UidClaims", "drop_privileges"]

CLAIMS_FILE = "sandbox-uids.lock"


class UidAllocator:
    """The uids of ``first``..``last`` (inclusive) that one process hands out. Pure: whether
    another process holds a uid is the ``claim`` function's business."""

    def __init__(self, first: int, last: int) -> None:
        if not 0 < first <= last:
            raise ValueError(f"not a uid range: {first}-{last}")
        self.first, self.last = first, last
        self._fresh = first  # every uid from here to last was never handed out
        self._released: deque[int] = deque()  # oldest first
        self._in_use: set[int] = set()

    @property
    def in_use(self) -> frozenset[int]:
        return frozenset(self._in_use)

    def check_free(self, count: int = 1) -> None:
        """Raises ``SandboxUidsExhausted`` when fewer than ``count`` uids are free, as far
        as this process knows (another one may hold those it does not)."""
        if len(self._released) + max(self.last - self._fresh + 1, 0) < count:
            raise self._exhausted()

    def acquire(self, claim: Callable[[int], bool] = lambda uid: True) -> int:
        """The lowest uid never handed out, else the one released longest ago, that
        ``claim`` accepts; one ``claim`` refuses (another process holds it) is tried last.

        Raises:
            SandboxUidsExhausted: every uid of the range is in use.
        """
        refused: list[int] = []
        try:
            while self._released or self._fresh <= self.last:
                if self._fresh <= self.last:
                    uid, self._fresh = self._fresh, self._fresh + 1
                else:
                    uid = self._released.popleft()
                refused.append(uid)  # until claimed: an error in claim must not lose it
                if claim(uid):
                    refused.pop()
                    self._in_use.add(uid)
                    return uid
        finally:
            self._released.extend(refused)
        raise self._exhausted()

    def release(self, uid: int) -> None:
        """Give ``uid`` back; only once nothing of its sandbox remains."""
        self._in_use.remove(uid)  # KeyError: a uid not handed out here
        self._released.append(uid)

    def _exhausted(self) -> SandboxUidsExhausted:
        return SandboxUidsExhausted(
            f"every host uid of the sandbox range {self.first}-{self.last} runs a live "
            "sandbox (an interactive sandbox takes two, a one-shot execution one); retry "
            "when one has ended (the operator may widen RINGFENCE_SANDBOX_UID_RANGE)"
        )


# struct flock: l_type, l_whence, (padding), l_start, l_len, l_pid, (padding)
_FLOCK = "hh4xqqi4x"


class UidClaims:
    """Host-wide claims on uids: a write lock (``F_OFD_SETLK``) on byte ``uid`` of ``path``.

    Open-file-description locks belong to this object's descriptor, not to the process, so
    two ``UidClaims`` conflict even within one process, and closing any other descriptor of
    the file drops nothing. The descriptor is close-on-exec: no sandbox ever holds it.
    """

    def __init__(self, path: Path) -> None:
        """Raises ``OSError`` when the file cannot be opened or created."""
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)

    def claim(self, uid: int) -> bool:
        """Claim ``uid``; False when another process (or another ``UidClaims``) holds it.

        Raises:
            OSError: the lock could not be asked for at all.
        """
        try:
            self._lock(fcntl.F_WRLCK, uid)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def release(self, uid: int) -> None:
        self._lock(fcntl.F_UNLCK, uid)

    def close(self) -> None:
        """Drop every claim at once."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _lock(self, kind: int, uid: int) -> None:
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, uid, 1, 0))


class SandboxUids:
    """The uids of ``config.sandbox_uid_range`` this process hands out, claimed host-wide
    in ``config.runtime_dir``."""

    def __init__(self, config: Config) -> None:
        """Raises ``OSError`` when the claims file cannot be opened."""
        self._allocator = UidAllocator(*config.sandbox_uids)
        self._claims = UidClaims(config.runtime_dir / CLAIMS_FILE)

    def check_free(self, count: int = 1) -> None:
        """Raises ``SandboxUidsExhausted`` when fewer than ``count`` are free, as far as
        this process knows."""
        self._allocator.check_free(count)

    def acquire(self) -> int:
        """Raises ``SandboxUidsExhausted`` (every uid is in use here or elsewhere on the
        host) or ``OSError``."""
        return self._allocator.acquire(self._claims.claim)

    def acquire_many(self, count: int) -> tuple[int, ...]:
        """``count`` uids for one sandbox, all or none (those taken go back on a failure).

        Raises:
            SandboxUidsExhausted: fewer than ``count`` are free here and elsewhere.
            OSError: a claim could not be asked for.
        """
        taken: list[int] = []
        try:
            while len(taken) < count:
                taken.append(self.acquire())
        except BaseException:
            for uid in taken:
                self.release(uid)
            raise
        return tuple(taken)

    def release(self, uid: int) -> None:
        """Give ``uid`` back: only once no process of its sandbox is left."""
        self._claims.release(uid)
        self._allocator.release(uid)

    def close(self) -> None:
        self._claims.close()


def drop_privileges(setpriv: str | None, uid: int) -> tuple[str, ...]:
    """The command prefix that runs what follows as host ``uid`` and gid ``uid``, with no
    supplementary groups and no capabilities; nothing when ``setpriv`` is None (Ringfence
    is not root: sandboxes run as its own uid). An exec'd setpriv rather than
    ``Popen(user=)``: Python cannot vfork when it changes uid, and fork costs grow with the
    server's size."""
    if setpriv is None:
        return ()
    return (
        setpriv,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    )
