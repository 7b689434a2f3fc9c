"""A bounded log: keeps the head and the tail of a stream, cuts the middle with a marker."""

from __future__ import annotations

from collections import deque

__all__ = ["BoundedLog"]


class BoundedLog:
    """Collects output in at most ``limit`` bytes of memory, however much is written.

    The first half of the budget keeps the beginning of the output (what the command was
    doing), the second half the end (how it failed); a marker replaces what was cut.
    """

    def __init__(self, limit: int) -> None:
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.dropped = 0

    def write(self, data: bytes) -> None:
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size > self._tail_limit:
            excess = self._tail_size - self._tail_limit
            first = self._tail[0]
            if len(first) <= excess:
                self._tail.popleft()
                self._tail_size -= len(first)
                self.dropped += len(first)
            else:
                self._tail[0] = first[excess:]
                self._tail_size -= excess
                self.dropped += excess

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        """The kept output as text (invalid UTF-8 replaced), with the marker if cut."""
        tail = b"".join(self._tail)
        if self.dropped:
            marker = f"\n[ringfence: {self.dropped} bytes of output cut here]\n".encode()
            data = bytes(self._head) + marker + tail
        else:
            data = bytes(self._head) + tail
        return data.decode("utf-8", errors="replace")
