"""The audit log's records and their hash chain. Pure: used by the store that appends and by
``ringfence audit verify``, offline, on an export.

A record is one JSON object (one line of an export). Its ``hash`` is the SHA-256 of its
canonical JSON without the ``hash`` field, and that JSON includes ``prev_hash``, the hash of
the record before it (``GENESIS`` for the first). Changing, removing, inserting or reordering
a record breaks the chain at that point. Seal records (``action`` ``audit.seal``) carry an
Ed25519 signature over their own position and the hash they follow; an export ends with a
fresh seal, so cutting its tail off removes the seal that covered it, and recomputing hashes
after a change cannot forge the signatures.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "GENESIS",
    "SEAL_ACTION",
    "SYSTEM",
    "AuditEvent",
    "AuditRecord",
    "canonical",
    "chain",
    "record_hash",
    "seal_message",
    "timestamp",
]

GENESIS = "0" * 64
SEAL_ACTION = "audit.seal"
SYSTEM = "ringfence"  # the actor of what the server does by itself
SEAL_TENANT, SEAL_TARGET, SEAL_OUTCOME = "", "audit", "ok"  # every seal's, fixed
_FIELDS = ("seq", "at", "tenant", "actor", "action", "target", "outcome", "details", "prev_hash")


@dataclass(frozen=True)
class AuditEvent:
    """Something that happened, before it has a place in the chain."""

    tenant: str  # "" for the whole installation (seals, server start)
    actor: str  # the key id that did it, or "ringfence" for the server itself
    action: str  # dotted, e.g. "sandbox.create", "proposal.approve", "execution.end"
    target: str  # what it acted on, e.g. "sandbox:sb12...", "proposal:cp34..."
    outcome: str = "ok"  # "ok", "denied", "failed", or a final status
    details: Mapping[str, Any] = field(default_factory=dict)
    at: datetime | None = None  # when; now when appended if None


@dataclass(frozen=True)
class AuditRecord:
    """A record in the chain."""

    seq: int
    at: str  # RFC 3339, UTC, microseconds: exactly the text that was hashed
    tenant: str
    actor: str
    action: str
    target: str
    outcome: str
    details: dict[str, Any]
    prev_hash: str
    hash: str

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in (*_FIELDS, "hash")}

    def line(self) -> str:
        """The record as one line of an export."""
        return canonical(self.to_json()).decode()

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> AuditRecord:
        """Raises ``ValueError`` when a field is missing or of the wrong type."""
        types = {
            "seq": int, "at": str, "tenant": str, "actor": str, "action": str, "target": str,
            "outcome": str, "details": dict, "prev_hash": str, "hash": str,
        }  # fmt: skip
        extra = set(value) - set(types)
        if extra:
            raise ValueError(f"unknown fields {sorted(extra)}")
        for name, kind in types.items():
            if not isinstance(value.get(name), kind) or isinstance(value.get(name), bool):
                raise ValueError(f"field {name!r} is missing or not a {kind.__name__}")
        return cls(**value)


def canonical(value: Any) -> bytes:
    """The one JSON encoding that is hashed: sorted keys, no spaces, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def record_hash(fields: Mapping[str, Any]) -> str:
    """The hash of a record: SHA-256 of the canonical JSON of every field but ``hash``."""
    return hashlib.sha256(canonical({name: fields[name] for name in _FIELDS})).hexdigest()


def timestamp(at: datetime | None = None) -> str:
    moment = (at or datetime.now(UTC)).astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Sign = Callable[[int, str, str], dict[str, Any]]


def chain(
    events: list[AuditEvent], last_seq: int, last_hash: str, sign: Sign | None = None
) -> list[AuditRecord]:
    """Place ``events`` after the record ``(last_seq, last_hash)`` (``0, GENESIS`` first).

    A seal event's details are ``sign(seq, at, prev_hash)``: known only here, in the chain.

    Raises:
        ValueError: an event's details cannot be JSON, or a seal comes without ``sign``.
    """
    records = []
    seq, prev = last_seq, last_hash
    for event in events:
        seq += 1
        at = timestamp(event.at)
        details = dict(event.details)
        if event.action == SEAL_ACTION:
            if sign is None:
                raise ValueError("a seal needs the signing key")
            details = sign(seq, at, prev)
        fields: dict[str, Any] = {
            "seq": seq,
            "at": at,
            "tenant": event.tenant,
            "actor": event.actor,
            "action": event.action,
            "target": event.target,
            "outcome": event.outcome,
            "details": json.loads(canonical(details)),
            "prev_hash": prev,
        }
        prev = record_hash(fields)
        records.append(AuditRecord(**fields, hash=prev))
    return records


def seal_message(seq: int, at: str, prev_hash: str) -> bytes:
    """What a seal's signature signs: its whole place in the chain and what it is, i.e.
    every field of the seal record but its details (which hold the signature).

    A seal's tenant, actor, action, target and outcome are fixed: only a record with exactly
    these is a seal, so signing its position, time and predecessor covers all of it.
    """
    return (
        f"ringfence-audit-seal:v1\n{seq}\n{at}\n{prev_hash}\n"
        f"{SEAL_TENANT}\n{SYSTEM}\n{SEAL_ACTION}\n{SEAL_TARGET}\n{SEAL_OUTCOME}"
    ).encode()
