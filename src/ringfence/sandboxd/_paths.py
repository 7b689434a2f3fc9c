"""Where relative paths and commands start: the sandbox user's home."""

from __future__ import annotations

import os

from ._errors import invalid

__all__ = ["home", "resolve"]


def home() -> str:
    return os.environ.get("HOME") or "/home/user"


def resolve(path: str | None, field: str = "path") -> str:
    """An absolute, normalised path: relative ones (and ``~``) start at the home directory."""
    if not path:
        raise invalid(f"{field} is required")
    if "\0" in path:
        raise invalid(f"{field} contains a NUL byte")
    if path == "~" or path.startswith("~/"):
        path = home() + path[1:]
    return os.path.normpath(os.path.join(home(), path))
