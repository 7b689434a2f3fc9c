"""Persistent state of the control plane (``ringfence[server]``).

The ``Store`` protocol and its implementations; the types it keeps (keys, executions,
sandboxes, proposals, audit queries) are the domain's, in ``ringfence.models``.

``SqlStore`` and ``sqlite_url`` are imported on first use: importing this package does not
import SQLAlchemy, so the conformance checks and ``MemoryStore`` need no database driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringfence.store._protocol import Store
from ringfence.store.memory import MemoryStore

if TYPE_CHECKING:
    from ringfence.store.sql import SqlStore, sqlite_url

__all__ = ["MemoryStore", "SqlStore", "Store", "sqlite_url"]


def __getattr__(name: str) -> object:
    if name in ("SqlStore", "sqlite_url"):
        from ringfence.store import sql

        return getattr(sql, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
