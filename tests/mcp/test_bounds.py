"""Bounding results: the pure helpers."""

from __future__ import annotations

import random

import pytest

from ringfence.mcp._bounds import OutputCap, clip


def test_short_text_is_kept_whole() -> None:
    assert clip("hello", 5) == ("hello", False)
    assert clip("", 0) == ("", False)


def test_long_text_keeps_its_start_and_end_and_names_the_cut() -> None:
    text, cut = clip("abcdefghij", 4)
    assert cut is True
    assert text == "ab\n[... 6 characters cut ...]\nij"


def test_an_odd_limit_leans_to_the_end() -> None:
    assert clip("abcdefghij", 3)[0] == "a\n[... 7 characters cut ...]\nij"
    assert clip("abcdefghij", 1)[0] == "\n[... 9 characters cut ...]\nj"


@pytest.mark.parametrize("limit", [0, 1, 2, 7, 64, 1000])
def test_a_stream_kept_in_pieces_is_the_whole_text_clipped(limit: int) -> None:
    generator = random.Random(limit)
    for _ in range(200):
        pieces = [
            "".join(generator.choice("ab\n") for _ in range(generator.randrange(0, 40)))
            for _ in range(generator.randrange(0, 30))
        ]
        cap = OutputCap(limit)
        for piece in pieces:
            cap.add(piece)
        whole = "".join(pieces)
        assert cap.text() == clip(whole, limit)
        assert cap.total == len(whole)


def test_a_stream_keeps_bounded_memory() -> None:
    cap = OutputCap(100)
    for _ in range(10_000):
        cap.add("x" * 97)
    kept = sum(len(p) for p in cap._head) + sum(len(p) for p in cap._tail)
    assert kept <= 100 + 97
