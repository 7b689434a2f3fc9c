"""A bounded queue on bare ``_thread`` locks.

``threading`` (and ``queue``) pull in ``collections`` and ``functools``, about 1 MB per
sandbox; this module needs only the lock primitive. Waiting uses the same trick as
``threading.Condition``: each waiter blocks on a private lock that a notifier releases.
"""

from __future__ import annotations

import _thread
import time

__all__ = ["Queue", "start_thread"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def start_thread(target: Callable[[], None]) -> None:
    _thread.start_new_thread(target, ())


class Queue:
    """Items of a known size, at most ``limit`` bytes queued (one oversized item always fits).

    ``put`` blocks while the queue is full, which is how a slow reader slows the producer
    down instead of growing memory. ``close`` wakes everyone: ``put`` then drops items and
    ``get`` drains what is left before returning ``CLOSED``.
    """

    CLOSED: object = object()

    def __init__(self, limit: int) -> None:
        self._mutex = _thread.allocate_lock()
        self._waiters: list[_thread.LockType] = []
        self._items: list[tuple[object, int]] = []
        self._size = 0
        self._limit = limit
        self.closed = False

    def _wait(self, deadline: float | None) -> bool:
        """Wait for a notify with the mutex held; False on timeout."""
        waiter = _thread.allocate_lock()
        waiter.acquire()
        self._waiters.append(waiter)
        self._mutex.release()
        try:
            if deadline is None:
                return waiter.acquire()
            return waiter.acquire(True, max(0.0, deadline - time.monotonic()))
        finally:
            self._mutex.acquire()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _notify_all(self) -> None:
        for waiter in self._waiters:
            waiter.release()
        self._waiters.clear()

    def put(self, item: object, size: int, timeout: float | None = None) -> bool:
        """Queue ``item``; False if the queue is closed or stayed full until ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._mutex:
            while not self.closed and self._items and self._size + size > self._limit:
                timed_out = not self._wait(deadline)
                if timed_out and deadline is not None and time.monotonic() >= deadline:
                    return False
            if self.closed:
                return False
            self._items.append((item, size))
            self._size += size
            self._notify_all()
            return True

    def get(self, timeout: float | None = None) -> object | None:
        """The next item, ``CLOSED`` once closed and drained, or None after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._mutex:
            while not self._items:
                if self.closed:
                    return Queue.CLOSED
                timed_out = not self._wait(deadline)
                if timed_out and deadline is not None and time.monotonic() >= deadline:
                    return None
            item, size = self._items.pop(0)
            self._size -= size
            self._notify_all()
            return item

    def close(self, *, discard: bool = False) -> None:
        with self._mutex:
            self.closed = True
            if discard:
                self._items.clear()
                self._size = 0
            self._notify_all()
