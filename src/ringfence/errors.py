"""Errors raised by Ringfence.

Every error Ringfence raises on purpose is a ``RingfenceError``; each class carries a stable
``code`` (API: it never changes) that HTTP responses, the CLI and the SDK use to tell errors
apart without matching message text.

    RingfenceError
    ├── InvalidRequest          bad input: the caller can fix it          (invalid_request)
    ├── NotFound                no such object in your tenant             (not_found)
    │   ├── ExecutionNotFound   no execution with that id
    │   ├── SandboxNotFound     no sandbox with that id
    │   ├── ProposalNotFound    no proposal with that id
    │   ├── CheckpointNotFound  no checkpoint (snapshot) with that id (checkpoint_not_found)
    │   └── VolumeNotFound      no volume with that name or id            (volume_not_found)
    ├── DuplicateExecution      an execution with that id already exists  (duplicate_id)
    ├── Conflict                the object's state does not allow it now  (conflict)
    │   ├── VolumeExists        a volume of yours has that name already   (volume_exists)
    │   └── VolumeInUse         a running or paused sandbox mounts it     (volume_in_use)
    ├── VolumeFull              the volume is at its quota                (volume_full)
    ├── StateUnsupported        no state capture here (checkpoint, pause) (state_unsupported)
    ├── SnapshotBudgetExceeded  checkpoints at their budget   (snapshot_budget_exceeded)
    ├── UnknownBackend          SANDBOX_BACKEND names no backend          (unknown_backend)
    ├── BackendUnavailable      the host lacks what the backend needs     (backend_unavailable)
    ├── SandboxError            the sandbox could not be set up or run    (sandbox_error)
    ├── SandboxNotRunning       the sandbox has ended (killed, expired)   (sandbox_not_running)
    ├── PortNotListening        nothing listens on that port in the sandbox (port_not_listening)
    ├── BrowserError            the sandbox's browser broke (Chromium died, its agent
    │   │                       answered garbage or too much)            (browser_failed)
    │   ├── BrowserActionFailed an action could not be done (no such element)
    │   │                                                          (browser_action_failed)
    │   ├── BrowserTimeout      the scrape's timeout passed               (browser_timeout)
    │   └── BrowserUnavailable  the template lacks Chromium or the Markdown converter
    │                                                              (browser_unavailable)
    ├── TooManyRequests         a limit on concurrent requests was hit    (too_many_requests)
    │   ├── SandboxUidsExhausted every host uid for sandboxes is in use   (sandbox_uids_exhausted)
    │   └── ServerAtCapacity    the server's totals have no room now      (server_at_capacity)
    ├── StoreError              the store failed (database unreachable)   (store_error)
    ├── Unauthenticated         no valid API key                          (unauthenticated)
    ├── Forbidden               the key's role may not do this            (forbidden)
    └── ServerUnreachable       the SDK could not reach the server        (unreachable)

The SDK raises the class named by the code a server answered with (``error_for``); a code it
does not know becomes a plain ``RingfenceError`` carrying that code.

Foreign exceptions (OSError from a syscall, pydantic's ValidationError) are translated at the
boundary that meets them, with ``raise ... from exc``.
"""

from __future__ import annotations

__all__ = [
    "HTTP_STATUS",
    "BackendUnavailable",
    "BrowserActionFailed",
    "BrowserError",
    "BrowserTimeout",
    "BrowserUnavailable",
    "CheckpointNotFound",
    "Conflict",
    "DuplicateExecution",
    "ExecutionNotFound",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "PortNotListening",
    "ProposalNotFound",
    "RingfenceError",
    "SandboxElsewhere",
    "SandboxError",
    "SandboxNotFound",
    "SandboxNotRunning",
    "SandboxUidsExhausted",
    "ServerAtCapacity",
    "ServerUnreachable",
    "SnapshotBudgetExceeded",
    "StateUnsupported",
    "StoreError",
    "TooManyRequests",
    "Unauthenticated",
    "UnknownBackend",
    "VolumeExists",
    "VolumeFull",
    "VolumeInUse",
    "VolumeNotFound",
    "error_for",
]


class RingfenceError(Exception):
    """The root of every error Ringfence raises on purpose."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(RingfenceError):
    """The request is malformed or asks for something not allowed; fix the input."""

    code = "invalid_request"


class NotFound(RingfenceError):
    """No object with this id exists in the caller's tenant (another tenant's looks the same)."""

    code = "not_found"


class ExecutionNotFound(NotFound):
    """No execution with this id exists (or it was forgotten after its retention time)."""


class SandboxNotFound(NotFound):
    """No sandbox with this id exists in the caller's tenant."""


class ProposalNotFound(NotFound):
    """No proposal with this id exists in the caller's tenant."""


class CheckpointNotFound(NotFound):
    """No checkpoint (or snapshot) with that id in this sandbox or tenant. Its own code:
    a rollback's 404 may be either the sandbox's or the checkpoint's, and the SDK must
    tell them apart."""

    code = "checkpoint_not_found"


class VolumeNotFound(NotFound):
    """No volume with that name (or id) in the caller's tenant: another tenant's looks the
    same. Its own code, so a file call's 404 on a missing path (``not_found``) and on a
    missing volume can be told apart."""

    code = "volume_not_found"


class StateUnsupported(RingfenceError):
    """The backend (or the host it runs on) cannot capture this sandbox's state: no
    writable layer, no freezer. The message names what is missing."""

    code = "state_unsupported"


class SnapshotBudgetExceeded(RingfenceError):
    """A sandbox's checkpoints hold as many (or as many bytes) as its budget allows:
    delete one first."""

    code = "snapshot_budget_exceeded"


class DuplicateExecution(RingfenceError):
    """An execution with this id is running, or its result is still retained."""

    code = "duplicate_id"


class Conflict(RingfenceError):
    """The object is not in a state that allows this (a decided proposal, say)."""

    code = "conflict"


class VolumeExists(Conflict):
    """A volume of the tenant's already has that name (names are unique per tenant)."""

    code = "volume_exists"


class VolumeInUse(Conflict):
    """A running or paused sandbox mounts the volume: it cannot be deleted until that
    sandbox ends."""

    code = "volume_in_use"


class VolumeFull(RingfenceError):
    """The volume has no room for the write (its quota): free some or use a larger one. Or,
    creating one, the quota does not fit the tenant's budget or the server's disk."""

    code = "volume_full"


class UnknownBackend(RingfenceError):
    """The configured backend name is not one Ringfence knows."""

    code = "unknown_backend"


class BackendUnavailable(RingfenceError):
    """The host lacks a prerequisite of the chosen backend; the message says how to fix it."""

    code = "backend_unavailable"


class SandboxError(RingfenceError):
    """The sandbox could not be created, supervised or cleaned up."""

    code = "sandbox_error"


class SandboxNotRunning(RingfenceError):
    """The sandbox exists but has ended (killed, expired or failed): it runs nothing more."""

    code = "sandbox_not_running"


class PortNotListening(RingfenceError):
    """Nothing listens on the port asked for, on the sandbox's loopback (a preview URL)."""

    code = "port_not_listening"


class BrowserError(RingfenceError):
    """A sandbox's browser failed: Chromium died or broke its protocol, or the browser
    agent inside the sandbox answered what is not its protocol (not HTTP, not JSON, past
    ``max_browser_result_bytes``). The sandbox is the upstream that failed: a 502."""

    code = "browser_failed"


class BrowserActionFailed(BrowserError):
    """An action of a scrape could not be done (no element matches its selector, a script
    threw); the message names the action's index and type. A 400: the caller's to fix."""

    code = "browser_action_failed"


class BrowserTimeout(BrowserError):
    """The scrape's ``timeout`` passed before it was done (or its agent did not answer in
    time)."""

    code = "browser_timeout"


class BrowserUnavailable(BrowserError):
    """The sandbox's template has no Chromium, or no Markdown converter for a call that
    asks for Markdown: use the browser template (docs/browser.md)."""

    code = "browser_unavailable"


class SandboxElsewhere(RingfenceError):
    """The sandbox runs, but on another server replica: only that one can reach it."""

    code = "sandbox_on_another_replica"


class TooManyRequests(RingfenceError):
    """Too many requests at once (for example to one sandbox); retry later."""

    code = "too_many_requests"


class ServerAtCapacity(TooManyRequests):
    """The server has granted all the memory or CPU it may (its host's); retry later."""

    code = "server_at_capacity"


class SandboxUidsExhausted(TooManyRequests):
    """Every host uid of the operator's sandbox range runs a live sandbox (sandboxes never
    share one); retry when one has ended."""

    code = "sandbox_uids_exhausted"


class StoreError(RingfenceError):
    """The store could not read or write (for example the database is unreachable)."""

    code = "store_error"


class Unauthenticated(RingfenceError):
    """The request carries no API key, or one that does not exist."""

    code = "unauthenticated"


class Forbidden(RingfenceError):
    """The key is valid, but its role may not do this."""

    code = "forbidden"


class ServerUnreachable(RingfenceError):
    """The SDK could not reach the server, or the connection broke (raised client-side)."""

    code = "unreachable"


def error_for(code: str, message: str) -> RingfenceError:
    """The exception for an error code a server answered with."""
    for cls in _ALL:
        if cls.code == code:
            return cls(message)
    error = RingfenceError(message)
    error.code = code
    return error


HTTP_STATUS: dict[str, int] = {
    RingfenceError.code: 500,
    InvalidRequest.code: 400,
    NotFound.code: 404,
    CheckpointNotFound.code: 404,
    DuplicateExecution.code: 409,
    Conflict.code: 409,
    StateUnsupported.code: 409,
    SnapshotBudgetExceeded.code: 507,
    VolumeNotFound.code: 404,
    VolumeExists.code: 409,
    VolumeInUse.code: 409,
    VolumeFull.code: 507,
    UnknownBackend.code: 400,
    BackendUnavailable.code: 503,
    SandboxError.code: 500,
    SandboxNotRunning.code: 409,
    PortNotListening.code: 502,  # Bad Gateway: the sandbox is the upstream that is not there
    SandboxElsewhere.code: 421,  # Misdirected Request: a router sent it to the wrong replica
    BrowserError.code: 502,  # Bad Gateway: the sandbox's browser is the upstream that failed
    # The caller's to fix (its selector, its script); not 422: the API keeps that status out
    # of its document, which a validation error never answers (400s, with the field named).
    BrowserActionFailed.code: 400,
    BrowserTimeout.code: 504,
    BrowserUnavailable.code: 503,
    TooManyRequests.code: 429,
    SandboxUidsExhausted.code: 503,  # the host's capacity, not the caller's rate
    ServerAtCapacity.code: 503,
    StoreError.code: 503,
    Unauthenticated.code: 401,
    Forbidden.code: 403,
}

_ALL: tuple[type[RingfenceError], ...] = (
    InvalidRequest, NotFound, DuplicateExecution, Conflict, UnknownBackend, BackendUnavailable,
    SandboxError, SandboxNotRunning, SandboxElsewhere, TooManyRequests, ServerAtCapacity,
    StoreError,
    Unauthenticated, Forbidden, ServerUnreachable, SandboxUidsExhausted, StateUnsupported,
    SnapshotBudgetExceeded, CheckpointNotFound, VolumeNotFound, VolumeExists, VolumeInUse,
    VolumeFull, PortNotListening, BrowserError, BrowserActionFailed, BrowserTimeout,
    BrowserUnavailable,
)  # fmt: skip
