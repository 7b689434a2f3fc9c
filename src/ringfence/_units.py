"""Parsing of human-written sizes ("256M", "1G", "1048576")."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_FACTOR = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: str | int) -> int:
    """Return a byte count from an int or a string like ``512``, ``256M``, ``1.5GiB``.

    Suffixes are binary (K = 1024). Raises ``ValueError`` naming the bad value.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative: {value}")
        return value
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"not a size: {value!r} (use bytes or a K, M, G, T suffix, e.g. 256M)")
    number, unit, _ = match.groups()
    return int(float(number) * _FACTOR[unit.lower()])


def format_size(n: int) -> str:
    """Return the shortest exact binary form of ``n`` bytes (``268435456`` -> ``256M``)."""
    for suffix, factor in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n and n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)
