"""Persistent state of the control plane (``ringfence[server]``)."""

from ringfence.store._protocol import ApiKey, ExecutionRecord, Role, Store
from ringfence.store.memory import MemoryStore

__all__ = ["ApiKey", "ExecutionRecord", "MemoryStore", "Role", "Store"]
