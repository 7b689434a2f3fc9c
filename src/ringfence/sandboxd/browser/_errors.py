"""The agent's one error type: a stable code, its HTTP status, and a message naming what
failed (the package docstring's table)."""

from __future__ import annotations

STATUS = {
    "invalid_request": 400,
    "action_failed": 422,
    "browser_failed": 502,
    "unavailable": 503,
    "timeout": 504,
}


class AgentError(Exception):
    """An error of a call, answered as ``{"error": {"code", "message"}}`` with ``status``."""

    def __init__(self, code: str, message: str) -> None:
        if code not in STATUS:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def body(self) -> dict[str, object]:
        return {"error": {"code": self.code, "message": self.message}}
