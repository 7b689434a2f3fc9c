"""Check an audit export offline: the chain, every seal, and that the export ends sealed.

``verify_export`` reads JSON lines (``ringfence audit export``) and names the first bad
record: its line and what is wrong. Without a pinned public key, the key in the first seal
is trusted (and said to be), so an attacker who rewrote the whole file with a key of their
own would pass: pin the server's key (``ringfence audit public-key``) to rule that out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from ringfence.audit.chain import (
    GENESIS,
    SEAL_ACTION,
    SEAL_OUTCOME,
    SEAL_TARGET,
    SEAL_TENANT,
    SYSTEM,
    AuditRecord,
    record_hash,
)
from ringfence.audit.signing import check_seal, parse_public_key
from ringfence.errors import InvalidRequest

__all__ = ["Problem", "Verdict", "verify_export"]


@dataclass(frozen=True)
class Problem:
    line: int  # 1-based line of the export
    seq: int | None  # the record's own sequence number, if it could be read
    reason: str


@dataclass(frozen=True)
class Verdict:
    records: int
    seals: int
    last_seal_seq: int | None
    last_seal_at: str | None
    public_key: str | None  # what the seals were checked against
    pinned: bool  # the key was given, not taken from the file
    problem: Problem | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify_export(lines: Iterable[str], public_key: str | None = None) -> Verdict:
    """Check every record of an export, in order; stop at the first bad one.

    Raises:
        InvalidRequest: ``public_key`` is not a base64 Ed25519 public key.
    """
    if public_key is not None:
        parse_public_key(public_key)  # a bad pinned key is the caller's error, said at once
    key, pinned = public_key, public_key is not None
    previous: AuditRecord | None = None
    count = seals = 0
    last_seal: AuditRecord | None = None
    line_no = 0

    def verdict(problem: Problem | None) -> Verdict:
        return Verdict(
            records=count,
            seals=seals,
            last_seal_seq=last_seal.seq if last_seal else None,
            last_seal_at=last_seal.at if last_seal else None,
            public_key=key,
            pinned=pinned,
            problem=problem,
        )

    for line_no, text in enumerate(lines, start=1):
        if not text.strip():
            return verdict(Problem(line_no, None, "an empty line"))
        try:
            record = AuditRecord.from_json(json.loads(text))
            computed = record_hash(record.to_json())
        except (ValueError, TypeError, RecursionError) as exc:
            return verdict(Problem(line_no, None, f"not an audit record: {exc}"))
        expected_seq = previous.seq + 1 if previous else 1
        if record.seq != expected_seq:
            return verdict(
                Problem(
                    line_no,
                    record.seq,
                    f"sequence {record.seq} where {expected_seq} was due "
                    "(a record was deleted, inserted or moved)",
                )
            )
        expected_prev = previous.hash if previous else GENESIS
        if record.prev_hash != expected_prev:
            return verdict(
                Problem(
                    line_no,
                    record.seq,
                    "it does not follow the record before it (prev_hash differs): "
                    "a record was changed, deleted, inserted or moved",
                )
            )
        if computed != record.hash:
            return verdict(Problem(line_no, record.seq, "its content does not match its hash"))
        if record.action == SEAL_ACTION:
            if (record.tenant, record.actor, record.target, record.outcome) != (
                SEAL_TENANT,
                SYSTEM,
                SEAL_TARGET,
                SEAL_OUTCOME,
            ) or set(record.details) != {"public_key", "signature"}:
                return verdict(Problem(line_no, record.seq, "a seal with altered fields"))
            embedded = record.details.get("public_key")
            if key is None and isinstance(embedded, str):
                key = embedded
            try:
                valid = key is not None and check_seal(
                    record.seq, record.at, record.prev_hash, record.details, key
                )
            except InvalidRequest:  # the file's own key is not a key: pinned ones are checked
                valid = False
            if not valid:
                return verdict(
                    Problem(line_no, record.seq, "a seal whose signature does not verify")
                )
            seals += 1
            last_seal = record
        count += 1
        previous = record
    if previous is None:
        return verdict(Problem(1, None, "the export holds no records"))
    if previous.action != SEAL_ACTION:
        first_unsealed = (last_seal.seq + 1) if last_seal else 1
        return verdict(
            Problem(
                line_no + 1,
                None,
                f"the export does not end with a seal: records from sequence {first_unsealed} "
                "on are not covered by a signature (the end was cut off?)",
            )
        )
    return verdict(None)
