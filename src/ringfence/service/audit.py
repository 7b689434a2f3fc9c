"""The audit log as the services use it: record what happened, in order, sealed regularly.

``record`` queues an event and returns at once: one writer task appends what is queued in
batches (one transaction each), so auditing a command costs its caller nothing. Decisions
that must be on record before anything acts on them (approvals) use ``record_now``, which
returns once the record is stored. Every ``seal_interval`` seconds with new records, and at
shutdown, a seal signs the chain's head. A queued record can be lost only if the process
dies within the moment between queueing and the write (milliseconds); a store that fails is
retried, and nothing queued is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from ringfence.audit.chain import SEAL_ACTION, SYSTEM, AuditEvent, AuditRecord
from ringfence.audit.signing import SealKey
from ringfence.errors import RingfenceError, StoreError
from ringfence.models import AuditQuery
from ringfence.store import Store

__all__ = ["AuditLog", "AuditRecords"]

log = logging.getLogger(__name__)

_BATCH = 500
# How long queued records wait for more before one write: a burst of commands costs one
# transaction instead of one each (a write took as long as a command's round trip).
_GATHER_SECONDS = 0.05
_RETRY_SECONDS = (0.1, 0.5, 1.0, 2.0, 5.0)


class AuditLog:
    def __init__(self, store: Store, key: SealKey, seal_interval: float = 60.0) -> None:
        self._store = store
        self._key = key
        self._seal_interval = seal_interval
        # (event, waiter); a flush is (None, waiter): answered once all before it is written.
        self._queue: asyncio.Queue[
            tuple[AuditEvent | None, asyncio.Future[AuditRecord | None] | None]
        ] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._unsealed = False

    @property
    def public_key(self) -> str:
        """The base64 Ed25519 key that checks this log's seals."""
        return self._key.public_key

    async def check_key(self) -> None:
        """Refuse a seal key other than the one that sealed this log first: one seal by
        another key would make every later export fail verification.

        Raises:
            StoreError: the log was sealed by another key (the message says which).
        """
        first = await self._store.list_audit(AuditQuery(action=SEAL_ACTION, limit=1))
        sealed_by = first[0].details.get("public_key") if first else None
        if sealed_by is not None and sealed_by != self._key.public_key:
            raise StoreError(
                f"this audit log was sealed by the key {sealed_by}, but the data directory "
                f"holds {self._key.public_key}: restore its audit-seal-key (every replica "
                "needs the same one)"
            )

    def start(self) -> None:
        """Start the writer (inside the event loop that will call ``record``)."""
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_forever())

    def record(
        self,
        tenant: str,
        actor: str,
        action: str,
        target: str,
        outcome: str = "ok",
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue an event; it is stored within moments. Never blocks, never raises."""
        event = AuditEvent(tenant, actor, action, target, outcome, details or {})
        self._queue.put_nowait((event, None))
        self.start()

    async def record_now(
        self,
        tenant: str,
        actor: str,
        action: str,
        target: str,
        outcome: str = "ok",
        details: Mapping[str, Any] | None = None,
    ) -> AuditRecord:
        """Store an event (after everything queued before it) and return its record.

        Raises:
            StoreError: the store failed (after retries).
        """
        event = AuditEvent(tenant, actor, action, target, outcome, details or {})
        done: asyncio.Future[AuditRecord | None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, done))
        self.start()
        record = await asyncio.shield(done)
        assert record is not None
        return record

    async def flush(self) -> None:
        """Return once everything queued before this call is stored."""
        done: asyncio.Future[AuditRecord | None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((None, done))
        self.start()
        await asyncio.shield(done)

    async def seal(self) -> AuditRecord:
        """Sign the chain's head now (after everything queued)."""
        return await self.record_now("", SYSTEM, SEAL_ACTION, "audit")

    async def query(self, query: AuditQuery) -> list[AuditRecord]:
        return await self._store.list_audit(query)

    async def aclose(self) -> None:
        """Write what is queued, seal, and stop."""
        if self._writer is None:
            return
        if self._unsealed or not self._queue.empty():
            with contextlib.suppress(RingfenceError):
                await self.seal()
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
        self._writer = None

    async def _write_forever(self) -> None:
        while True:
            try:
                first = await asyncio.wait_for(self._queue.get(), self._seal_interval)
            except TimeoutError:
                if self._unsealed:
                    self._queue.put_nowait((AuditEvent("", SYSTEM, SEAL_ACTION, "audit"), None))
                continue
            if first[1] is None:  # nobody waits: gather what comes meanwhile, write once
                await asyncio.sleep(_GATHER_SECONDS)
            batch = [first]
            while len(batch) < _BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._append(batch)

    async def _append(
        self,
        batch: list[tuple[AuditEvent | None, asyncio.Future[AuditRecord | None] | None]],
    ) -> None:
        events = [event for event, _ in batch if event is not None]
        failures = 0
        while True:
            try:
                records = await self._store.append_audit(events, self._key.sign)
                break
            except RingfenceError as exc:
                failures += 1
                if failures == 1:
                    log.warning("the audit log cannot be written; retrying: %s", exc)
                if failures == len(_RETRY_SECONDS):
                    log.error("the audit log cannot be written; will keep trying: %s", exc)
                    for _, done in batch:  # waiters learn it; the records stay queued
                        if done is not None and not done.done():
                            done.set_exception(exc)
                await asyncio.sleep(_RETRY_SECONDS[min(failures, len(_RETRY_SECONDS)) - 1])
        if records:
            self._unsealed = records[-1].action != SEAL_ACTION
        placed = iter(records)
        for event, done in batch:
            record = next(placed) if event is not None else None
            if done is not None and not done.done():
                done.set_result(record)


class AuditRecords:
    """The audit log as the operator's offline commands use it (``ringfence audit export``
    and ``tail``, no server running): its records read as they are stored, and a seal made
    at once. No writer task, no seal interval: nothing else is written."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def query(self, query: AuditQuery) -> list[AuditRecord]:
        """The records ``query`` matches, oldest first. Raises: StoreError."""
        return await self._store.list_audit(query)

    async def seal(self, key: SealKey) -> AuditRecord:
        """Sign the chain's head now with ``key`` and return the seal. The caller checked
        that ``key`` is the log's (a seal by another would fail every export's check).

        Raises:
            StoreError: the store failed.
        """
        [seal] = await self._store.append_audit(
            [AuditEvent("", SYSTEM, SEAL_ACTION, "audit")], key.sign
        )
        return seal
