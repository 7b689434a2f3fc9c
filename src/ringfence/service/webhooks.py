"""Webhooks: new proposals and egress asks and their decisions, posted to the operator's
URLs, signed, retried.

Each delivery is a JSON POST with the event, the tenant and the proposal (its request's
environment reduced to variable names: values may be secrets) or the egress ask. It is
signed with
HMAC-SHA256 over ``"<timestamp>.<body>"`` using the configured secret, sent as
``Ringfence-Signature: sha256=<hex>`` beside ``Ringfence-Timestamp`` (seconds since the
epoch), so a receiver can check both the sender and the freshness. A delivery is retried
with exponential backoff on a network error or a non-2xx answer. Nothing here ever blocks
or fails a decision: ``notify`` only queues, and a full queue drops the oldest delivery
with an error in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ringfence.models import Proposal
from ringfence.service.egress_asks import EgressAsk

__all__ = ["WebhookNotifier", "signature"]

log = logging.getLogger(__name__)

_ATTEMPTS = 6
_FIRST_BACKOFF_SECONDS = 1.0
_TIMEOUT_SECONDS = 10.0
_MAX_QUEUED = 10_000


@dataclass(frozen=True)
class _Delivery:
    url: str
    event: str
    id: str
    body: bytes


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``Ringfence-Signature`` value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


class WebhookNotifier:
    """Posts proposal and egress ask events to ``urls``. ``start`` in the event loop;
    ``aclose`` at the end (deliveries still retrying are abandoned, with a log line)."""

    def __init__(
        self,
        urls: Sequence[str],
        secret: str,
        *,
        attempts: int = _ATTEMPTS,
        first_backoff: float = _FIRST_BACKOFF_SECONDS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._urls = list(urls)
        self._secret = secret
        self._attempts = attempts
        self._first_backoff = first_backoff
        self._queue: asyncio.Queue[_Delivery] = asyncio.Queue(_MAX_QUEUED)
        self._client = httpx.AsyncClient(timeout=_TIMEOUT_SECONDS, transport=transport)
        self._workers: list[asyncio.Task[None]] = []

    def start(self, workers: int = 4) -> None:
        if not self._workers:
            self._workers = [asyncio.create_task(self._work()) for _ in range(workers)]

    def notify(self, event: str, tenant: str, proposal: Proposal) -> None:
        """Queue one delivery per URL. Never blocks, never raises."""
        self._queue_event(event, {"event": event, "tenant": tenant, "proposal": _public(proposal)})

    def notify_ask(self, event: str, tenant: str, ask: EgressAsk) -> None:
        """Queue one delivery per URL for an egress ask. Never blocks, never raises."""
        self._queue_event(
            event, {"event": event, "tenant": tenant, "ask": ask.model_dump(mode="json")}
        )

    def _queue_event(self, event: str, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        for url in self._urls:
            delivery = _Delivery(url, event, secrets.token_hex(12), body)
            if self._queue.full():
                dropped = self._queue.get_nowait()
                log.error("webhook queue full: dropped %s to %s", dropped.event, dropped.url)
            self._queue.put_nowait(delivery)
        self.start()

    async def aclose(self) -> None:
        for worker in self._workers:
            worker.cancel()
        for worker in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        self._workers = []
        if not self._queue.empty():
            log.warning("%d webhook deliveries were not sent", self._queue.qsize())
        await self._client.aclose()

    async def _work(self) -> None:
        while True:
            delivery = await self._queue.get()
            await self._deliver(delivery)

    async def _deliver(self, delivery: _Delivery) -> None:
        backoff = self._first_backoff
        for attempt in range(1, self._attempts + 1):
            timestamp = str(int(time.time()))
            headers = {
                "content-type": "application/json",
                "user-agent": "ringfence-webhooks",
                "ringfence-event": delivery.event,
                "ringfence-delivery": delivery.id,
                "ringfence-timestamp": timestamp,
                "ringfence-signature": signature(self._secret, timestamp, delivery.body),
            }
            try:
                response = await self._client.post(
                    delivery.url, content=delivery.body, headers=headers
                )
                if response.is_success:
                    return
                why = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            if attempt == self._attempts:
                log.error(
                    "webhook %s to %s failed %d times, given up: %s",
                    delivery.event, delivery.url, attempt, why,
                )  # fmt: skip
                return
            log.warning("webhook %s to %s failed (%s); retrying", delivery.event, delivery.url, why)
            await asyncio.sleep(backoff)
            backoff *= 2


def _public(proposal: Proposal) -> dict[str, Any]:
    """The proposal as sent out: environment values (possible secrets) reduced to names."""
    data = proposal.model_dump(mode="json")
    data["request"]["env"] = sorted(proposal.request.env)
    if data.get("result"):
        data["result"].pop("logs", None)  # output may carry secrets too; fetch it by API
    return data
