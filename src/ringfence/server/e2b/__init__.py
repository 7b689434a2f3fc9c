"""E2B compatibility: E2B's official SDKs, unmodified, against Ringfence (docs/e2b.md)."""

from ringfence.server.e2b.layer import E2bLayer

__all__ = ["E2bLayer"]
