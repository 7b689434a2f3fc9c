"""The one error type of the daemon: a Connect error code and a message for the caller."""

from __future__ import annotations

__all__ = ["RpcError", "http_status", "invalid"]

# The canonical HTTP status of each Connect code (connectrpc.com/docs/protocol#error-codes).
_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class RpcError(Exception):
    """A Connect error: ``code`` is one of the lower-case Connect codes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code if code in _STATUS else "unknown"
        self.message = message


def http_status(code: str) -> int:
    return _STATUS.get(code, 500)


def invalid(message: str) -> RpcError:
    return RpcError("invalid_argument", message)


# errno → Connect code, for the filesystem and process services.
_ERRNO_CODES = {
    2: "not_found",  # ENOENT
    17: "already_exists",  # EEXIST
    39: "already_exists",  # ENOTEMPTY
    20: "invalid_argument",  # ENOTDIR
    21: "invalid_argument",  # EISDIR
    22: "invalid_argument",  # EINVAL
    40: "invalid_argument",  # ELOOP
    36: "invalid_argument",  # ENAMETOOLONG
    18: "invalid_argument",  # EXDEV
    13: "permission_denied",  # EACCES
    1: "permission_denied",  # EPERM
    30: "permission_denied",  # EROFS
    28: "resource_exhausted",  # ENOSPC
    122: "resource_exhausted",  # EDQUOT
}


def from_os_error(exc: OSError, what: str) -> RpcError:
    """Translate ``exc`` raised while doing ``what`` (e.g. "stat /x") into a Connect error."""
    code = _ERRNO_CODES.get(exc.errno or 0, "internal")
    reason = exc.strerror or str(exc)
    if code == "resource_exhausted":
        reason += " (the sandbox's disk is full or its quota is reached)"
    return RpcError(code, f"{what}: {reason}")
