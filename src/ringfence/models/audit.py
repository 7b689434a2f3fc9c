"""Which audit records a reader asks for (the records themselves: ``ringfence.audit.chain``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["AuditQuery"]


@dataclass(frozen=True)
class AuditQuery:
    """Which audit records: every set field must match. Oldest first, from ``after_seq``."""

    tenant: str | None = None  # None: every tenant's, and the installation's own ("")
    actor: str | None = None
    action: str | None = None  # exact, or a prefix ending with "." ("proposal.")
    target: str | None = None
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive
    after_seq: int = 0
    limit: int = 100
