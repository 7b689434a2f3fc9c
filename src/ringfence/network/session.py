"""One sandbox's (or one execution's) egress: who it is, its policy, its decisions.

The policy can be replaced while the sandbox runs (through the API only: nothing inside the
sandbox reaches this object). ``ask`` decisions are remembered for the session's life.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ringfence.models import EgressAction, NetworkPolicy
from ringfence.policy.egress import Verdict

__all__ = [
    "Asker",
    "AuditSink",
    "EgressSession",
    "Requester",
    "SessionLookup",
    "current_requester",
    "requesting",
]

log = logging.getLogger(__name__)

_MAX_QUESTIONS_RECORDED = 4096
MAX_OPEN_ASKS = 4  # asks of one sandbox waiting for a human at once
MAX_ASKS = 256  # destinations one sandbox may ask about in its life


class AuditSink(Protocol):
    """Where attempts are recorded (``service.audit.AuditLog``). Must not block or raise."""

    def record(
        self,
        tenant: str,
        actor: str,
        action: str,
        target: str,
        outcome: str = "ok",
        details: Mapping[str, Any] | None = None,
    ) -> None: ...


class Asker(Protocol):
    """Asks a human whether ``requester`` may reach ``host:port``. True: approved. Errors
    and timeouts must come back as False (an approver that fails means deny)."""

    async def ask(self, requester: Requester, host: str, port: int) -> bool: ...


@dataclass(frozen=True)
class Requester:
    """Who a sandbox's egress belongs to, for the audit record and for ``ask``."""

    tenant: str = ""
    subject: str = ""  # "sandbox:<id>" or "execution:<id>"; filled in by the backend if empty
    actor: str = ""  # the key that created the sandbox, shown to approvers
    audit: AuditSink | None = None
    asker: Asker | None = None


_requester: contextvars.ContextVar[Requester | None] = contextvars.ContextVar(
    "ringfence_egress_requester", default=None
)


def current_requester() -> Requester:
    return _requester.get() or Requester()


@contextlib.contextmanager
def requesting(requester: Requester) -> Iterator[None]:
    """Sandboxes started in this block (and in tasks created in it) belong to
    ``requester``: the service layer says so without threading it through the backend."""
    token = _requester.set(requester)
    try:
        yield
    finally:
        _requester.reset(token)


class EgressSession:
    """The egress state of one running sandbox."""

    def __init__(self, requester: Requester, policy: NetworkPolicy) -> None:
        self.requester = requester
        self._policy = policy
        self._asked: dict[tuple[str, int], asyncio.Future[bool]] = {}
        self._questions: set[tuple[str, int, str]] = set()
        self.unrecorded_questions = 0  # past _MAX_QUESTIONS_RECORDED distinct questions

    @property
    def policy(self) -> NetworkPolicy:
        return self._policy

    def hand_over(self, requester: Requester) -> None:
        """Make the session ``requester``'s (a pooled sandbox's, at its claim): what the
        previous owner's sandbox asked is forgotten with the owner, so the new one's
        record holds every question its sandbox asks from now on, also one the pool's
        processes asked before (once per name, type and outcome: deduplicated per owner)."""
        self.requester = requester
        self._questions.clear()
        self.unrecorded_questions = 0
        self._asked.clear()  # a deny-all policy asks nobody; no answer is another's

    def set_policy(self, policy: NetworkPolicy) -> None:
        """Replace the policy: connections from now on are decided by it (open ones keep
        going; answers already given to ``ask`` are kept)."""
        self._policy = policy

    async def settle(self, verdict: Verdict, host: str, port: int) -> Verdict:
        """An ``ask`` verdict turned into allow or deny by a human (once per destination);
        other verdicts unchanged."""
        if verdict.action is not EgressAction.ASK:
            return verdict
        key = (host, port)
        pending = self._asked.get(key)
        if pending is None:
            refused = self._too_many_asks()
            if refused is not None:
                self.record("network.ask", "refused", {"host": host, "port": port,
                                                        "reason": refused})  # fmt: skip
                return Verdict(EgressAction.DENY, f"{host}:{port}: {refused}", verdict.rule)
            pending = asyncio.get_running_loop().create_future()
            self._asked[key] = pending
            try:
                pending.set_result(await self._ask(host, port))
            finally:
                if not pending.done():  # cancelled while asking: those waiting are denied
                    pending.set_result(False)
                    del self._asked[key]
        approved = await asyncio.shield(pending)
        if approved:
            return Verdict(EgressAction.ALLOW, f"{host}:{port} was approved", verdict.rule)
        return Verdict(EgressAction.DENY, f"{host}:{port} was not approved", verdict.rule)

    def _too_many_asks(self) -> str | None:
        """Why a new ask is refused without asking, if it is: a sandbox may not flood the
        approvers (nor this process's memory) with questions."""
        open_asks = sum(not answer.done() for answer in self._asked.values())
        if open_asks >= MAX_OPEN_ASKS:
            return f"{open_asks} asks of this sandbox already wait for a human; denied unasked"
        if len(self._asked) >= MAX_ASKS:
            return f"this sandbox has asked about {MAX_ASKS} destinations; denied unasked"
        return None

    async def _ask(self, host: str, port: int) -> bool:
        asker = self.requester.asker
        if asker is None:
            return False  # nobody to ask: deny
        self.record("network.ask", "asked", {"host": host, "port": port})
        try:
            approved = await asker.ask(self.requester, host, port)
        except Exception:  # boundary: an approver that fails means deny
            log.exception("asking about %s:%s failed; denied", host, port)
            approved = False
        self.record(
            "network.ask", "approved" if approved else "rejected", {"host": host, "port": port}
        )
        return approved

    def record_question(
        self, name: str, qtype: int, outcome: str, details: Mapping[str, Any]
    ) -> None:
        """Audit a DNS question, once per name, type and outcome for the session's life (a
        resolver is asked the same thing over and over: the log keeps what was asked)."""
        key = (name, qtype, outcome)
        if key in self._questions:
            return
        if len(self._questions) >= _MAX_QUESTIONS_RECORDED:
            self.unrecorded_questions += 1
            return
        self._questions.add(key)
        self.record("network.dns", outcome, details)

    def record(self, action: str, outcome: str, details: Mapping[str, Any]) -> None:
        audit = self.requester.audit
        if audit is None:
            return
        requester = self.requester
        audit.record(requester.tenant, requester.subject, action, requester.subject, outcome,
                     details)  # fmt: skip


class SessionLookup(Protocol):
    """Where a running sandbox's egress session is found, to change its policy live: the
    local backend's ``EgressGateway``, a Kubernetes replica's ``PodEgressProxy``."""

    def session(self, tenant: str, subject: str) -> EgressSession | None: ...
