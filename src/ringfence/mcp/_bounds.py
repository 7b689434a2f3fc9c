"""How much of a result an agent gets: pure helpers that cut text and count what was cut.

A tool result goes into a model's context window, so every text field is bounded. What is
cut is the middle (the start says what ran, the end says how it ended), and the result says
so: a ``truncated`` flag next to the text, and a marker where the text was cut.
"""

from __future__ import annotations

from collections import deque

__all__ = ["OutputCap", "clip"]


def _marker(cut: int) -> str:
    return f"\n[... {cut} characters cut ...]\n"


def clip(text: str, limit: int) -> tuple[str, bool]:
    """``text`` if it has at most ``limit`` characters; else its start and its end around
    a marker naming how much was cut, ``limit`` characters in all (the marker aside)."""
    if len(text) <= limit:
        return text, False
    head = limit // 2
    tail = limit - head
    cut = len(text) - limit
    return text[:head] + _marker(cut) + (text[-tail:] if tail else ""), True


class OutputCap:
    """A stream's output as it arrives, kept in bounded memory: its first ``limit // 2``
    characters and its last ``limit - limit // 2``, and how many there were in all."""

    def __init__(self, limit: int) -> None:
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head: list[str] = []
        self._head_size = 0
        self._tail: deque[str] = deque()
        self._tail_size = 0
        self.total = 0

    def add(self, text: str) -> None:
        self.total += len(text)
        room = self._head_limit - self._head_size
        if room > 0:
            taken = text[:room]
            self._head.append(taken)
            self._head_size += len(taken)
            text = text[room:]
        if not text or not self._tail_limit:
            return
        self._tail.append(text)
        self._tail_size += len(text)
        while self._tail_size - len(self._tail[0]) >= self._tail_limit:
            self._tail_size -= len(self._tail.popleft())

    def text(self) -> tuple[str, bool]:
        """What was kept, with a marker where the middle was cut; and whether it was."""
        tail = "".join(self._tail)
        if len(tail) > self._tail_limit:
            tail = tail[len(tail) - self._tail_limit :]
        head = "".join(self._head)
        cut = self.total - len(head) - len(tail)
        if cut <= 0:
            return head + tail, False
        return head + _marker(cut) + tail, True
