"""``rf.proposals``: propose a remediation, decide on it, wait for its outcome.

The pure helpers (the requests, how answers are read, the polling schedule) under the two thin
I/O shells: ``AsyncProposals`` in ``_async`` and its generated blocking twin ``Proposals`` in
``_sync``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import httpx

from ringfence.client._base import Call, _segment, build_request, checked
from ringfence.errors import InvalidRequest, ProposalNotFound, RingfenceError
from ringfence.models import ExecutionRequest, Proposal, ProposalSpec, ProposalState, Risk, problems

__all__ = [
    "ProposalNotFound",
    "StateFilter",
    "WaitTimeout",
    "approve_call",
    "build_spec",
    "create_call",
    "deadline_after",
    "delays",
    "get_call",
    "list_call",
    "past",
    "pause_before_next_poll",
    "read_proposal",
    "read_proposals",
    "reject_call",
    "timed_out",
]

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


def pause_before_next_poll(delay: float, deadline: float | None) -> float:
    """``delay``, cut short so that the last poll comes at ``deadline``."""
    return delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))


def past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def deadline_after(timeout: float | None) -> float | None:
    """The ``time.monotonic()`` at which ``timeout`` seconds have passed (None: never)."""
    return None if timeout is None else time.monotonic() + timeout
