"""Proposals and the approval handler: the only path that runs a remediation.

The rules, each enforced here and each tested as an attempted bypass:
- an approval names the digest of the request it approves; the stored request must still
  hash to it, so any change needs a new proposal;
- agent keys propose and read, never approve or reject; nobody approves their own proposal,
  nor approves twice;
- approvals are accepted only within the approval window (``approval_ttl``), and a sweep
  marks pending proposals ``expired`` once it closes;
- high-risk proposals need ``high_risk_approvals`` distinct approvers; the operator's risk
  policy (``RINGFENCE_RISK_POLICY``, ``ringfence.policy.risk``) may raise a proposal's risk
  or refuse it, and the proposer cannot lower it;
- every change is a compare-and-set on the proposal's version, so of two racing decisions
  one wins, and the move to ``executing`` happens once: an approval executes at most once;
- a request's egress header values (credentials) are sealed under the credentials key
  the moment it is proposed: the proposal shows, stores in clear, digests and hands on
  (webhooks, the console, the audit log) markers in their place, which bind the values
  (``service/credentials.py``); the handler opens them only to run the approved request;
- once the approvals are in, the handler runs exactly the approved request at once, with
  ``checkpoint_id`` and ``approved_by`` filled in, through the execution service, under the
  proposal's own id: an id of a form no client may submit (``is_proposal_id``), so no
  execution of a client's can take the run's place.
Every decision is on the audit record before anything acts on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Protocol

from ringfence.audit.chain import SYSTEM
from ringfence.config import Config
from ringfence.errors import Conflict, Forbidden, InvalidRequest, ProposalNotFound, RingfenceError
from ringfence.models import (
    Decision,
    ExecutionRequest,
    ExecutionResult,
    Proposal,
    ProposalSpec,
    ProposalState,
    Risk,
    Role,
    Status,
    new_proposal_id,
    request_digest,
)
from ringfence.policy.risk import assess, load_risk_policy
from ringfence.service.audit import AuditLog
from ringfence.service.credentials import CredentialKey, is_marker
from ringfence.service.executions import RESTART_ERROR, ExecutionService
from ringfence.service.keys import Principal
from ringfence.store import Store

__all__ = ["ApprovalService", "Notifier", "ProposalNotFound"]

log = logging.getLogger(__name__)

_SWEEP_SECONDS = 5.0
_DECIDERS = (Role.APPROVER, Role.ADMIN)


class Notifier(Protocol):
    """Told of new proposals and of decisions (webhooks). Must not block or raise."""

    def notify(self, event: str, tenant: str, proposal: Proposal) -> None: ...


class ApprovalService:
    def __init__(
        self,
        store: Store,
        executions: ExecutionService,
        audit: AuditLog,
        config: Config,
        notifier: Notifier | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        credentials: CredentialKey | None = None,
    ) -> None:
        """``credentials``: the key proposals' credentials are sealed under; None, a key of
        this process only (what it seals cannot be opened after a restart)."""
        self._store = store
        self._credentials = credentials or CredentialKey.generate()
        self._executions = executions
        self._audit = audit
        self._config = config
        self._risk_policy = load_risk_policy(config.risk_policy)  # a bad one: no start
        self._notifier = notifier
        self._clock = clock
        self._runs: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def reconcile(self) -> int:
        """After a restart: proposals approved or running here can never finish (their
        executions were marked failed); mark them failed too. Returns how many."""
        ended = 0
        for tenant, proposal in await self._store.unfinished_proposals():
            result = ExecutionResult(
                execution_id=proposal.execution_id or proposal.request.id,
                status=Status.FAILED,
                error=RESTART_ERROR,
            )
            with contextlib.suppress(Conflict):
                failed = await self._change(
                    tenant, proposal, state=ProposalState.FAILED, result=result
                )
                self._audit.record(
                    tenant, SYSTEM, "proposal.executed", _target(failed), "failed",
                    {"error": RESTART_ERROR},
                )  # fmt: skip
                ended += 1
        return ended

    def start(self) -> None:
        """Start the sweep that expires pending proposals."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever())

    async def propose(self, caller: Principal, spec: ProposalSpec) -> Proposal:
        """Record a proposal (any key may propose).

        Raises:
            InvalidRequest: the request sets what only the handler sets, or is not allowed.
            Forbidden: the request asks for something no tenant may, or the operator's risk
                policy forbids it (or could not be evaluated: fail closed).
        """
        request = spec.request
        if request.checkpoint_id is not None or request.approved_by is not None:
            raise InvalidRequest(
                "request: checkpoint_id and approved_by are filled in by the approval "
                "handler, not by the proposer"
            )
        self._executions.check_policy(request, approved=True)
        risk = assess(
            self._risk_policy, request, tenant=caller.tenant, requester=caller.key_id,
            role=caller.role.value, proposed=spec.risk,
            where=self._executions.placement(caller.tenant, request),
        )  # fmt: skip
        if risk.refusal is not None:
            await self._audit.record_now(
                caller.tenant, caller.key_id, "proposal.create", "proposal:-", "denied",
                {"why": risk.refusal, "risk_rules": list(risk.rules), "command": request.argv},
            )  # fmt: skip
            raise Forbidden(risk.refusal)
        proposal_id = new_proposal_id()
        request = request.model_copy(update={"id": proposal_id})  # what it will run under
        request, sealed = self._sealed(caller.tenant, proposal_id, request)
        now = self._clock()
        proposal = Proposal(
            id=proposal_id,
            state=ProposalState.PENDING,
            request=request,
            digest=request_digest(request),
            rationale=spec.rationale,
            risk=risk.risk,
            risk_source=risk.source,
            risk_rules=list(risk.rules),
            session_id=spec.session_id,
            task_id=spec.task_id,
            proposed_by=caller.key_id,
            created_at=now,
            expires_at=now + timedelta(seconds=self._config.approval_ttl),
            sealed_credentials=sealed,
            required_approvals=(self._config.high_risk_approvals if risk.risk is Risk.HIGH else 1),
        )
        await self._store.add_proposal(caller.tenant, proposal)
        await self._audit.record_now(
            caller.tenant,
            caller.key_id,
            "proposal.create",
            _target(proposal),
            details={
                "digest": proposal.digest,
                "risk": proposal.risk.value,
                "risk_source": proposal.risk_source.value,
                "risk_rules": proposal.risk_rules,
                "command": request.argv,
                "target_namespace": request.target_namespace,
                "rationale": proposal.rationale,
                "session_id": proposal.session_id,
                "task_id": proposal.task_id,
            },
        )
        self._notify("proposal.created", caller.tenant, proposal)
        return proposal

    async def get(self, tenant: str, proposal_id: str) -> Proposal:
        """Raises ``ProposalNotFound`` (also for another tenant's)."""
        proposal = await self._store.get_proposal(tenant, proposal_id)
        if proposal is None:
            raise ProposalNotFound(f"no proposal with id {proposal_id!r}")
        return proposal

    async def list(
        self, tenant: str, *, states: Collection[ProposalState] | None = None, limit: int = 100
    ) -> list[Proposal]:
        return await self._store.list_proposals(tenant, states=states, limit=limit)

    async def approve(
        self, caller: Principal, proposal_id: str, digest: str, reason: str
    ) -> Proposal:
        """Add the caller's approval; with enough of them, the action runs at once.

        Raises:
            ProposalNotFound: no such proposal in the caller's tenant.
            Forbidden: an agent key, or the proposer approving their own.
            Conflict: not pending (decided, expired, running, done), already approved by
                this key, a digest that is not the request's, or a concurrent decision won.
        """
        _check_reason(reason, required=False)
        proposal = await self._decidable(caller, proposal_id, "approve")
        if caller.key_id == proposal.proposed_by:
            await self._denied(caller, proposal, "approve", "own proposal")
            raise Forbidden("a proposer cannot approve their own proposal")
        if digest != proposal.digest:
            await self._denied(caller, proposal, "approve", "the digest differs")
            raise Conflict(
                "digest: this approval is for another request than the one proposed; "
                "read the proposal again (any change needs a new proposal)"
            )
        if _credentials_lost(proposal):
            await self._denied(caller, proposal, "approve", "its credentials were removed")
            raise Conflict(
                "this proposal's egress header values were removed from the store (a "
                "Ringfence upgrade stopped keeping them in clear): propose it again"
            )
        if request_digest(proposal.request) != proposal.digest:
            await self._denied(caller, proposal, "approve", "the stored request changed")
            raise Conflict("the stored request no longer matches its digest: refused")
        if any(approval.by == caller.key_id for approval in proposal.approvals):
            await self._denied(caller, proposal, "approve", "approved twice")
            raise Conflict("you already approved this proposal; another approver must")
        approvals = [
            *proposal.approvals,
            Decision(by=caller.key_id, at=self._clock(), reason=reason),
        ]
        ready = len(approvals) >= proposal.required_approvals
        changed = await self._change(
            caller.tenant,
            proposal,
            approvals=approvals,
            state=ProposalState.APPROVED if ready else ProposalState.PENDING,
        )
        await self._audit.record_now(
            caller.tenant,
            caller.key_id,
            "proposal.approve",
            _target(changed),
            details={
                "digest": digest,
                "reason": reason,
                "approvals": len(approvals),
                "required": proposal.required_approvals,
            },
        )
        self._notify("proposal.approved" if ready else "proposal.approval", caller.tenant, changed)
        if ready:
            changed = await self._execute(caller.tenant, changed)
        return changed

    async def reject(self, caller: Principal, proposal_id: str, reason: str) -> Proposal:
        """Reject the proposal, with a reason.

        Raises:
            ProposalNotFound, Forbidden (agent keys), Conflict (not pending any more).
        """
        _check_reason(reason, required=True)
        proposal = await self._decidable(caller, proposal_id, "reject")
        rejection = Decision(by=caller.key_id, at=self._clock(), reason=reason)
        changed = await self._change(
            caller.tenant, proposal, state=ProposalState.REJECTED, rejection=rejection
        )
        await self._audit.record_now(
            caller.tenant,
            caller.key_id,
            "proposal.reject",
            _target(changed),
            details={"reason": reason},
        )
        self._notify("proposal.rejected", caller.tenant, changed)
        return changed

    async def expire_due(self) -> int:
        """Mark ``expired`` every pending proposal whose window closed; how many."""
        expired = 0
        for tenant, proposal in await self._store.expired_proposals(self._clock()):
            with contextlib.suppress(Conflict):
                changed = await self._change(tenant, proposal, state=ProposalState.EXPIRED)
                self._audit.record(tenant, SYSTEM, "proposal.expire", _target(changed))
                self._notify("proposal.expired", tenant, changed)
                expired += 1
        return expired

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await asyncio.gather(*self._runs, return_exceptions=True)

    async def _decidable(self, caller: Principal, proposal_id: str, verb: str) -> Proposal:
        """The proposal, if ``caller`` may decide on it now."""
        proposal = await self.get(caller.tenant, proposal_id)
        if caller.role not in _DECIDERS:
            await self._denied(caller, proposal, verb, "agent key")
            raise Forbidden(f"agent keys cannot {verb} proposals (approver or admin keys can)")
        if proposal.state is ProposalState.PENDING and self._clock() >= proposal.expires_at:
            with contextlib.suppress(Conflict):
                proposal = await self._change(caller.tenant, proposal, state=ProposalState.EXPIRED)
                self._audit.record(caller.tenant, SYSTEM, "proposal.expire", _target(proposal))
        if proposal.state is not ProposalState.PENDING:
            await self._denied(caller, proposal, verb, f"it is {proposal.state.value}")
            raise Conflict(
                f"proposal {proposal_id} is {proposal.state.value}: it can no longer be "
                f"{verb}d"
                + (
                    " (its approval window closed)"
                    if proposal.state is ProposalState.EXPIRED
                    else ""
                )
            )
        return proposal

    async def _change(self, tenant: str, proposal: Proposal, **update: object) -> Proposal:
        """Store ``proposal`` with ``update``, if nobody changed it since it was read.

        Raises:
            Conflict: someone did: this change lost.
        """
        changed = proposal.model_copy(update={**update, "version": proposal.version + 1})
        if not await self._store.replace_proposal(tenant, changed):
            raise Conflict(f"proposal {proposal.id} was decided by someone else meanwhile")
        return changed

    async def _execute(self, tenant: str, proposal: Proposal) -> Proposal:
        """Run the approved request, exactly, once. Returns the proposal as ``executing``."""
        approvers = ",".join(approval.by for approval in proposal.approvals)
        request = proposal.request.model_copy(
            update={"id": proposal.id, "checkpoint_id": proposal.id, "approved_by": approvers}
        )  # the id too: a proposal stored before ids were the server's may name another
        executing = await self._change(
            tenant, proposal, state=ProposalState.EXECUTING, execution_id=request.id
        )  # the one move to executing: a replay or a racing approval cannot pass it
        run = asyncio.create_task(self._run(tenant, executing, request))
        self._runs.add(run)
        run.add_done_callback(self._runs.discard)
        return executing

    async def _run(self, tenant: str, proposal: Proposal, request: ExecutionRequest) -> None:
        try:
            request = self._opened(tenant, proposal, request)
            result = await self._executions.submit(
                tenant, request, wait=True, actor=SYSTEM, approved=True
            )
        except RingfenceError as exc:
            result = ExecutionResult(
                execution_id=request.id, status=Status.FAILED, error=exc.message
            )
        except Exception:  # boundary: the proposal must end whatever happens
            log.exception("approved proposal %s/%s failed inside Ringfence", tenant, proposal.id)
            result = ExecutionResult(
                execution_id=request.id, status=Status.FAILED, error="internal error"
            )
        state = (
            ProposalState.SUCCEEDED if result.status is Status.SUCCEEDED else ProposalState.FAILED
        )
        try:
            done = await self._change(tenant, proposal, state=state, result=result)
        except (Conflict, RingfenceError):
            log.exception("could not store the outcome of proposal %s/%s", tenant, proposal.id)
            return
        self._audit.record(
            tenant, SYSTEM, "proposal.executed", _target(done), state.value,
            {"execution_id": request.id, "exit_code": result.exit_code, "error": result.error},
        )  # fmt: skip
        self._notify(f"proposal.{state.value}", tenant, done)

    def _sealed(
        self, tenant: str, proposal_id: str, request: ExecutionRequest
    ) -> tuple[ExecutionRequest, str | None]:
        """``request`` with markers for its header values, and the values sealed."""
        network = request.network
        if network is None or not any(rule.headers for rule in network.rules):
            return request, None
        sealed = self._credentials.seal(network, tenant=tenant, proposal_id=proposal_id)
        marked = self._credentials.marked(network, tenant=tenant, proposal_id=proposal_id)
        return request.model_copy(update={"network": marked}), sealed

    def _opened(
        self, tenant: str, proposal: Proposal, request: ExecutionRequest
    ) -> ExecutionRequest:
        """``request`` with the header values its markers stand for.

        Raises:
            Conflict: they cannot be opened, or are not the ones approved.
        """
        if _credentials_lost(proposal):
            raise Conflict("this proposal's egress header values are gone: refused")
        if proposal.sealed_credentials is None or request.network is None:
            return request
        network = self._credentials.open(
            proposal.sealed_credentials, request.network, tenant=tenant, proposal_id=proposal.id
        )
        return request.model_copy(update={"network": network})

    async def _denied(self, caller: Principal, proposal: Proposal, verb: str, why: str) -> None:
        await self._audit.record_now(
            caller.tenant, caller.key_id, f"proposal.{verb}", _target(proposal), "denied",
            {"why": why},
        )  # fmt: skip

    def _notify(self, event: str, tenant: str, proposal: Proposal) -> None:
        if self._notifier is not None:
            try:
                self._notifier.notify(event, tenant, proposal)
            except Exception:  # boundary: a notifier never blocks a decision
                log.exception("notifying %s failed", event)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_SECONDS)
            try:
                await self.expire_due()
            except RingfenceError as exc:
                log.warning("expiring proposals failed: %s", exc)


_MAX_REASON = 10_000


def _check_reason(reason: str, *, required: bool) -> None:
    if required and not reason.strip():
        raise InvalidRequest("reason: a rejection says why")
    if len(reason) > _MAX_REASON:
        raise InvalidRequest(f"reason: at most {_MAX_REASON} characters")


def _credentials_lost(proposal: Proposal) -> bool:
    """Markers without the values they stand for, or values that are neither (a proposal
    stored before credentials were sealed, its values since removed): it cannot run."""
    network = proposal.request.network
    values = [v for rule in network.rules for v in rule.headers.values()] if network else []
    if proposal.sealed_credentials is None:
        return bool(values)
    return not all(is_marker(value) for value in values)


def _target(proposal: Proposal) -> str:
    return f"proposal:{proposal.id}"
