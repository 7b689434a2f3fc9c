"""The tamper-evident audit log: hash-chained records sealed with Ed25519 (``chain``,
``signing``), checked offline (``verify``)."""

from ringfence.audit.chain import GENESIS, SEAL_ACTION, SYSTEM, AuditEvent, AuditRecord
from ringfence.audit.signing import SealKey
from ringfence.audit.verify import Verdict, verify_export

__all__ = [
    "GENESIS",
    "SEAL_ACTION",
    "SYSTEM",
    "AuditEvent",
    "AuditRecord",
    "SealKey",
    "Verdict",
    "verify_export",
]
