"""``rf.proposals``: propose a remediation, decide on it, wait for its outcome.

Pure helpers (the requests, how answers are read, the polling schedule) and the two thin I/O
shells over them: ``AsyncProposals`` (the source) and its blocking twin ``Proposals``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from ringfence.client._base import Call, _segment, build_request, checked
from ringfence.errors import InvalidRequest, ProposalNotFound, RingfenceError
from ringfence.models import ExecutionRequest, Proposal, ProposalSpec, ProposalState, Risk, problems

if TYPE_CHECKING:
    from ringfence.client._async import AsyncRingfence
    from ringfence.client._sync import Ringfence

__all__ = ["AsyncProposals", "ProposalNotFound", "Proposals", "WaitTimeout"]

# Polling for an outcome: quick at first (a short command finishes in well under a second),
# then every couple of seconds, so a long wait costs the server little.
_FIRST_DELAY = 0.1
_MAX_DELAY = 2.0
_GROWTH = 1.5


class WaitTimeout(RingfenceError):
    """``wait`` gave up before the proposal reached an outcome; ``proposal`` is how it was
    last seen (it is not withdrawn: it may still be approved and run)."""

    code = "wait_timeout"

    def __init__(self, message: str, proposal: Proposal) -> None:
        super().__init__(message)
        self.proposal = proposal


StateFilter = ProposalState | str | Iterable[ProposalState | str] | None


def build_spec(
    command: Sequence[str] | ExecutionRequest,
    *,
    rationale: str,
    risk: Risk | str,
    session_id: str | None,
    task_id: str | None,
    fields: Mapping[str, Any],
) -> ProposalSpec:
    """The proposal to send. A command list becomes a request with ``fields``, labelled with
    ``session_id`` and ``task_id`` like the proposal (so the execution that runs carries
    them); a whole ``ExecutionRequest`` is sent as given, and lends its labels to the
    proposal when none are passed.

    Raises:
        InvalidRequest: a field is invalid (checked here, before anything is sent).
    """
    if not isinstance(command, ExecutionRequest):
        labels = {"session_id": session_id, "task_id": task_id}
        fields = {**{k: v for k, v in labels.items() if v is not None}, **fields}
    request = build_request(command, fields)
    try:
        return ProposalSpec(
            request=request,
            rationale=rationale,
            risk=Risk(risk),
            session_id=session_id if session_id is not None else request.session_id,
            task_id=task_id if task_id is not None else request.task_id,
        )
    except ValueError as exc:  # pydantic's ValidationError, or an unknown risk
        raise InvalidRequest(problems(exc)) from exc


def create_call(spec: ProposalSpec) -> Call:
    return Call("POST", "/v1/proposals", json=spec.model_dump(mode="json", exclude_none=True))


def get_call(proposal_id: str) -> Call:
    return Call("GET", f"/v1/proposals/{_segment(proposal_id)}")


def list_call(state: StateFilter, limit: int) -> Call:
    """Raises ``InvalidRequest`` for a state that does not exist."""
    if state is None:
        states: list[ProposalState | str] = []
    elif isinstance(state, str):
        states = [state]
    else:
        states = list(state)
    try:
        values = [ProposalState(s).value for s in states]
    except ValueError as exc:
        raise InvalidRequest(f"state: {exc}") from exc
    params: dict[str, Any] = {"limit": limit}
    if values:
        params["state"] = values
    return Call("GET", "/v1/proposals", params)


def approve_call(proposal_id: str, digest: str, reason: str) -> Call:
    body = {"digest": digest, "reason": reason}
    return Call("POST", f"/v1/proposals/{_segment(proposal_id)}/approve", json=body)


def reject_call(proposal_id: str, reason: str) -> Call:
    return Call("POST", f"/v1/proposals/{_segment(proposal_id)}/reject", json={"reason": reason})


def read_proposal(response: httpx.Response) -> Proposal:
    return Proposal.model_validate(checked(response, ProposalNotFound))


def read_proposals(response: httpx.Response) -> list[Proposal]:
    return [Proposal.model_validate(item) for item in checked(response)]


def delays() -> Iterator[float]:
    """Seconds between polls: growing from 0.1 to at most 2."""
    delay = _FIRST_DELAY
    while True:
        yield delay
        delay = min(delay * _GROWTH, _MAX_DELAY)


def timed_out(proposal: Proposal, timeout: float | None) -> WaitTimeout:
    return WaitTimeout(
        f"proposal {proposal.id} is still {proposal.state.value} after {timeout:g} s", proposal
    )


def _next_sleep(delay: float, deadline: float | None) -> float:
    return delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


class AsyncProposals:
    """Remediations that run only once a human approves them (see docs/approvals.md)."""

    def __init__(self, client: AsyncRingfence) -> None:
        self._client = client

    async def create(
        self,
        request_or_command: Sequence[str] | ExecutionRequest,
        *,
        rationale: str,
        risk: Risk | str = Risk.LOW,
        session_id: str | None = None,
        task_id: str | None = None,
        **request_fields: Any,
    ) -> Proposal:
        """Propose ``request_or_command`` (a list, or a whole ``ExecutionRequest``); further
        keyword arguments are the request's fields (``timeout=``, ``env=``,
        ``remediation_action=``, ``target_namespace=``...). Returns it ``pending``, with the
        ``digest`` an approval must name. Any key may propose.

        Raises:
            InvalidRequest: a field is invalid, or sets ``checkpoint_id``/``approved_by``.
            Forbidden, Unauthenticated, ServerUnreachable.
        """
        spec = build_spec(
            request_or_command, rationale=rationale, risk=risk, session_id=session_id,
            task_id=task_id, fields=request_fields,
        )  # fmt: skip
        return read_proposal(await self._client._send(create_call(spec)))

    async def get(self, proposal_id: str) -> Proposal:
        """Raises ``ProposalNotFound``."""
        return read_proposal(await self._client._send(get_call(proposal_id)))

    async def list(self, *, state: StateFilter = None, limit: int = 100) -> list[Proposal]:
        """Your tenant's proposals, newest first; ``state`` is one state or several."""
        return read_proposals(await self._client._send(list_call(state, limit)))

    async def approve(
        self, proposal_id: str, *, digest: str | None = None, reason: str = ""
    ) -> Proposal:
        """Approve (approver and admin keys); with enough approvals it runs at once, and the
        answer says ``executing``.

        Pass the ``digest`` of the proposal you reviewed: the server refuses the approval if
        the request is not that one. Without it, the proposal is read again and its current
        digest approved: you approve whatever it holds now, not what you looked at.

        Raises:
            ProposalNotFound: no such proposal in your tenant.
            Forbidden: an agent key, or your own proposal.
            Conflict: not pending any more, already approved by you, or another digest.
        """
        if digest is None:
            digest = (await self.get(proposal_id)).digest
        return read_proposal(await self._client._send(approve_call(proposal_id, digest, reason)))

    async def reject(self, proposal_id: str, *, reason: str) -> Proposal:
        """Reject, saying why (approver and admin keys).

        Raises:
            ProposalNotFound, Forbidden (agent keys), Conflict (not pending any more),
            InvalidRequest (an empty reason).
        """
        return read_proposal(await self._client._send(reject_call(proposal_id, reason)))

    async def wait(self, proposal_id: str, timeout: float | None = None) -> Proposal:
        """The proposal once it is ``succeeded``, ``failed``, ``rejected`` or ``expired``,
        polling with a growing interval (at most 2 s). A pending proposal waits for its
        approvals, up to its approval window.

        Raises:
            WaitTimeout: ``timeout`` seconds passed first.
            ProposalNotFound.
        """
        deadline = _deadline(timeout)
        for delay in delays():
            proposal = await self.get(proposal_id)
            if proposal.state.is_final:
                return proposal
            if _past(deadline):
                raise timed_out(proposal, timeout)
            await asyncio.sleep(_next_sleep(delay, deadline))
        raise AssertionError("unreachable")  # delays() never ends


class Proposals:
    """The blocking twin of ``AsyncProposals`` (same helpers, same errors)."""

    def __init__(self, client: Ringfence) -> None:
        self._client = client

    def create(
        self,
        request_or_command: Sequence[str] | ExecutionRequest,
        *,
        rationale: str,
        risk: Risk | str = Risk.LOW,
        session_id: str | None = None,
        task_id: str | None = None,
        **request_fields: Any,
    ) -> Proposal:
        spec = build_spec(
            request_or_command, rationale=rationale, risk=risk, session_id=session_id,
            task_id=task_id, fields=request_fields,
        )  # fmt: skip
        return read_proposal(self._client._send(create_call(spec)))

    def get(self, proposal_id: str) -> Proposal:
        return read_proposal(self._client._send(get_call(proposal_id)))

    def list(self, *, state: StateFilter = None, limit: int = 100) -> list[Proposal]:
        return read_proposals(self._client._send(list_call(state, limit)))

    def approve(self, proposal_id: str, *, digest: str | None = None, reason: str = "") -> Proposal:
        """See ``AsyncProposals.approve``: pass the digest you reviewed."""
        if digest is None:
            digest = self.get(proposal_id).digest
        return read_proposal(self._client._send(approve_call(proposal_id, digest, reason)))

    def reject(self, proposal_id: str, *, reason: str) -> Proposal:
        return read_proposal(self._client._send(reject_call(proposal_id, reason)))

    def wait(self, proposal_id: str, timeout: float | None = None) -> Proposal:
        deadline = _deadline(timeout)
        for delay in delays():
            proposal = self.get(proposal_id)
            if proposal.state.is_final:
                return proposal
            if _past(deadline):
                raise timed_out(proposal, timeout)
            time.sleep(_next_sleep(delay, deadline))
        raise AssertionError("unreachable")  # delays() never ends
