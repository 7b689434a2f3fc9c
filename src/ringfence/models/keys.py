"""API keys: who may call, in which tenant, with which role."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

__all__ = ["ApiKey", "Role"]


class Role(StrEnum):
    """What a key may do. The strings are API: they never change."""

    AGENT = "agent"  # run sandboxes and executions, propose remediations
    APPROVER = "approver"  # and approve or reject other people's proposals
    ADMIN = "admin"  # and manage keys


@dataclass(frozen=True)
class ApiKey:
    """A stored key. The secret itself is never stored: only its SHA-256 digest (hex).

    ``name``: who or what holds it, given at creation (shown in the console and the audit
    log; "" for keys made before names). ``revoked_at``: when it was revoked (then it is
    refused everywhere, and kept only for the record); a revoked key is never valid again.
    ``rotated_at``: when its secret was last replaced (its id, name and role stay).
    """

    key_id: str
    tenant: str
    role: Role
    secret_hash: str
    created_at: datetime
    description: str = ""
    name: str = ""
    revoked_at: datetime | None = None
    rotated_at: datetime | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None
