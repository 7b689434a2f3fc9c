"""What is wrong with an input, in our own words: the one-line form every boundary answers with."""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_core import ErrorDetails

__all__ = ["problems", "said"]


def problems(exc: Exception) -> str:
    """What is wrong, in one line naming each field: ``limits.pids: Input should be ...;
    env: ...`` (a ``ValidationError``), or the error's own words."""
    if not isinstance(exc, ValidationError):
        return " ".join(str(exc).split())
    found = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "input"
        found.append(f"{where}: {said(error)}")
    return " ".join("; ".join(found).split())


def said(error: ErrorDetails) -> str:
    """One validation error's message in our own words: a validator's ``ValueError`` without
    the ``Value error,`` pydantic puts before it."""
    message = error["msg"]
    if error["type"] == "value_error":
        message = message.removeprefix("Value error, ")
    return message
