"""``ask`` egress rules: a human decides whether a sandbox may reach a destination.

The first connection to a destination an ``ask`` rule matches waits while an ask is open
(the sandbox, the destination and the key that created the sandbox are on it). The rules of
the approval workflow apply: agent keys cannot decide, nobody decides on an ask raised by a
sandbox of their own key, every decision is on the audit record before the connection
goes on, and an ask left undecided for ``approval_ttl`` seconds is denied. The decision is
remembered for the sandbox's life (by its egress session). Asks live in memory: the
connection that waits on one does not outlive the server either. A notifier (the webhooks)
is told when an ask opens and when it closes, whichever way.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, Field

from ringfence.config import Config
from ringfence.errors import Conflict, Forbidden, NotFound, RingfenceError
from ringfence.models import Role
from ringfence.network.session import Requester
from ringfence.service.audit import AuditLog
from ringfence.service.keys import Principal

__all__ = ["AskNotifier", "EgressAsk", "EgressAskNotFound", "EgressAskState", "EgressAsks"]

log = logging.getLogger(__name__)

_DECIDERS = (Role.APPROVER, Role.ADMIN)
_KEEP_DECIDED = 1000  # decided asks kept for listing, newest


class EgressAskNotFound(NotFound):
    """No egress ask with this id in the caller's tenant."""


class EgressAskState(StrEnum):
    """The strings are API."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"  # nobody decided in time: denied
    ABANDONED = "abandoned"  # the connection that asked went away first: denied


class EgressAsk(BaseModel):
    id: str
    state: EgressAskState
    sandbox: str = Field(description="sandbox:<id> or execution:<id>.")
    host: str
    port: int
    requested_by: str = Field(description="The key that created the sandbox.")
    created_at: datetime
    expires_at: datetime
    decided_by: str | None = None
    decided_at: datetime | None = Field(None, description="When it was decided or closed.")
    reason: str | None = None


class AskNotifier(Protocol):
    """Told of asks opening and closing (webhooks). Must not block or raise."""

    def notify_ask(self, event: str, tenant: str, ask: EgressAsk) -> None: ...


class EgressAsks:
    """Open asks, and the ``Asker`` the egress proxy calls."""

    def __init__(
        self,
        audit: AuditLog,
        config: Config,
        notifier: AskNotifier | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._audit = audit
        self._notifier = notifier
        self._ttl = config.approval_ttl
        self._clock = clock
        self._asks: dict[str, tuple[str, EgressAsk]] = {}  # id -> (tenant, ask)
        self._waiting: dict[str, asyncio.Future[bool]] = {}

    async def ask(self, requester: Requester, host: str, port: int) -> bool:
        """Open an ask and wait for its decision; False unless a human approved."""
        now = self._clock()
        pending = EgressAsk(
            id="na" + secrets.token_hex(10), state=EgressAskState.PENDING,
            sandbox=requester.subject, host=host, port=port,
            requested_by=requester.actor, created_at=now,
            expires_at=now + timedelta(seconds=self._ttl),
        )  # fmt: skip
        await self._audit.record_now(
            requester.tenant, requester.subject, "network.ask.open", f"egress-ask:{pending.id}",
            details={"sandbox": requester.subject, "host": host, "port": port,
                     "requested_by": requester.actor},
        )  # fmt: skip
        # Listed (and decidable) only once on the record, and from here to the ``try`` with
        # no await: a connection that goes away at any point leaves no ask pending.
        decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._asks[pending.id] = (requester.tenant, pending)
        self._waiting[pending.id] = decided
        self._notify("network.ask.opened", requester.tenant, pending)
        try:
            return await asyncio.wait_for(asyncio.shield(decided), self._ttl)
        except TimeoutError:
            self._close(requester.tenant, pending.id, EgressAskState.EXPIRED)
            self._audit.record(
                requester.tenant, "system", "network.ask.expire", f"egress-ask:{pending.id}"
            )
            return False
        finally:
            self._waiting.pop(pending.id, None)
            if self._asks[pending.id][1].state is EgressAskState.PENDING:
                self._close(requester.tenant, pending.id, EgressAskState.ABANDONED)
            self._trim()

    def list(self, tenant: str, *, pending_only: bool = False) -> list[EgressAsk]:
        asks = [ask for owner, ask in self._asks.values() if owner == tenant]
        if pending_only:
            asks = [ask for ask in asks if ask.state is EgressAskState.PENDING]
        return sorted(asks, key=lambda ask: ask.created_at, reverse=True)

    def get(self, tenant: str, ask_id: str) -> EgressAsk:
        """Raises ``EgressAskNotFound`` (also for another tenant's)."""
        found = self._asks.get(ask_id)
        if found is None or found[0] != tenant:
            raise EgressAskNotFound(f"no egress ask with id {ask_id!r}")
        return found[1]

    async def decide(
        self, caller: Principal, ask_id: str, approve: bool, reason: str = ""
    ) -> EgressAsk:
        """Approve or reject an open ask.

        Raises:
            EgressAskNotFound: no such ask in the caller's tenant.
            Forbidden: an agent key, or the key whose sandbox asked.
            Conflict: it is not pending any more.
        """
        ask = self.get(caller.tenant, ask_id)
        verb, done = ("approve", "approved") if approve else ("reject", "rejected")
        target = f"egress-ask:{ask_id}"
        why: str | None = None
        error: RingfenceError | None = None
        if caller.role not in _DECIDERS:
            why, error = "agent key", Forbidden(f"agent keys cannot {verb} egress asks")
        elif caller.key_id == ask.requested_by:
            why, error = "own sandbox", Forbidden("the key whose sandbox asked cannot decide")
        elif ask.state is not EgressAskState.PENDING:
            why, error = (
                f"it is {ask.state.value}",
                Conflict(f"egress ask {ask_id} is {ask.state.value}: it can no longer be {done}"),
            )
        if why is not None and error is not None:
            await self._audit.record_now(
                caller.tenant, caller.key_id, f"network.ask.{verb}", target, "denied",
                {"why": why},
            )  # fmt: skip
            raise error
        state = EgressAskState.APPROVED if approve else EgressAskState.REJECTED
        decided = self._close(caller.tenant, ask_id, state, caller.key_id, reason, notify=False)
        # On the record before the connection goes on.
        await self._audit.record_now(
            caller.tenant, caller.key_id, f"network.ask.{verb}", target,
            details={"host": ask.host, "port": ask.port, "sandbox": ask.sandbox,
                     "reason": reason},
        )  # fmt: skip
        waiting = self._waiting.get(ask_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(approve)
        self._notify(f"network.ask.{state.value}", caller.tenant, decided)
        return decided

    def _close(
        self,
        tenant: str,
        ask_id: str,
        state: EgressAskState,
        by: str | None = None,
        reason: str | None = None,
        notify: bool = True,
    ) -> EgressAsk:
        ask = self._asks[ask_id][1].model_copy(
            update={"state": state, "decided_by": by, "decided_at": self._clock(),
                    "reason": reason}
        )  # fmt: skip
        self._asks[ask_id] = (tenant, ask)
        if notify:
            self._notify(f"network.ask.{state.value}", tenant, ask)
        return ask

    def _notify(self, event: str, tenant: str, ask: EgressAsk) -> None:
        if self._notifier is not None:
            try:
                self._notifier.notify_ask(event, tenant, ask)
            except Exception:  # boundary: a notifier never blocks a connection or a decision
                log.exception("notifying %s failed", event)

    def _trim(self) -> None:
        decided = [i for i, (_, a) in self._asks.items() if a.state is not EgressAskState.PENDING]
        for ask_id in decided[: max(len(decided) - _KEEP_DECIDED, 0)]:
            del self._asks[ask_id]
