"""The audit writer: queued records land in order, in few writes; flush and record_now wait."""

from __future__ import annotations

from ringfence.audit.chain import AuditEvent, AuditRecord, Sign
from ringfence.audit.signing import SealKey
from ringfence.audit.verify import verify_export
from ringfence.models import AuditQuery
from ringfence.service.audit import AuditLog
from ringfence.store import MemoryStore


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    async def append_audit(
        self, events: list[AuditEvent], sign: Sign | None = None
    ) -> list[AuditRecord]:
        self.writes += 1
        return await super().append_audit(events, sign)


async def test_a_burst_is_one_write_and_flush_waits_for_it() -> None:
    store = CountingStore()
    audit = AuditLog(store, SealKey.generate())
    for n in range(20):
        audit.record("acme", "k1", "sandbox.Start", f"sandbox:sb{n}")
    await audit.flush()
    stored = await store.list_audit(AuditQuery(limit=100))
    assert [r.target for r in stored] == [f"sandbox:sb{n}" for n in range(20)]
    assert store.writes == 1, "gathered into one transaction"
    now = await audit.record_now("acme", "k2", "proposal.approve", "proposal:cp1")
    assert now.seq == 21 and store.writes == 2
    await audit.aclose()  # seals what is not sealed
    everything = await store.list_audit(AuditQuery(limit=100))
    assert everything[-1].action == "audit.seal"
    assert verify_export([r.line() for r in everything], audit.public_key).ok
