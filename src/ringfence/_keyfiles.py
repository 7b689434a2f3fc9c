"""Key files in the data directory: written once, 0600, atomically."""

from __future__ import annotations

import base64
import os
from pathlib import Path

__all__ = ["create_once"]


def create_once(path: Path, raw: bytes) -> bool:
    """Write ``raw`` (as base64) to a new key file at ``path``, readable by its owner only.

    The file appears whole or not at all (a temporary file, then a link), and never replaces
    one: returns False when another process made one first (read theirs instead).

    Raises:
        OSError: the directory or the file cannot be written.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(base64.b64encode(raw).decode() + "\n")
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        temporary.unlink()
    return True
