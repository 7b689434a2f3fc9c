"""What both doors share of the daemon pass-through: its services as a path parameter, and
a daemon's ``Answer`` as a Starlette response."""

from __future__ import annotations

from enum import StrEnum

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from ringfence.sandboxd.methods import FILESYSTEM, PROCESS
from ringfence.service.sandbox_answers import PASSED_STATUSES, REFUSAL_HEADERS, Answer

__all__ = ["Service", "answered", "streamed"]


class Service(StrEnum):
    """The daemon's RPC services (E2B envd's): a call to any other is refused unsent."""

    PROCESS = PROCESS
    FILESYSTEM = FILESYSTEM


def streamed(answer: Answer) -> StreamingResponse:
    """The answer as it is, its body streamed (E2B's door: envd's refusals included)."""
    return StreamingResponse(
        answer.stream(),
        status_code=answer.status,
        headers=answer.headers,
        background=BackgroundTask(answer.aclose),
    )


async def answered(answer: Answer) -> Response:
    """The answer in the native API's shape: streamed when the daemon did what was asked,
    a refusal as ``{"error": {code, message}}`` (``sandbox_answers.sandbox_error``)."""
    if answer.status in PASSED_STATUSES:
        return streamed(answer)
    status, code, message = await answer.refusal()
    return JSONResponse({"error": {"code": code, "message": message}}, status, REFUSAL_HEADERS)
