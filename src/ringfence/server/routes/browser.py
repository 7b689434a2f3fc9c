"""The browser sandbox on the native API: scrapes in a sandbox's browser (a session across
calls), its status and its close, and one-shot scrapes in a pooled sandbox of their own
(docs/browser.md). The semantics are ``service.browser``'s; these routes find the caller
by its key. (``GET /v1/sandboxes/{id}/browser/cdp``, the CDP WebSocket, is served apart:
docs/design.md 15.5.)"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from ringfence.models.browser import BrowserStatus, ScrapeRequest, ScrapeResult
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody
from ringfence.server.routes.executions import BUDGET_ERRORS

__all__ = ["one_shot", "router"]

router = APIRouter(prefix="/v1/sandboxes", tags=["browser"])
one_shot = APIRouter(prefix="/v1/browser", tags=["browser"])

SandboxId = Annotated[str, Path(max_length=64, description="The sandbox's id.")]

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such sandbox in your tenant"},
    409: {
        "model": ErrorBody,
        "description": "The sandbox has ended, or is paused and was created with auto_resume "
        "off (sandbox_not_running)",
    },
    502: {
        "model": ErrorBody,
        "description": "The sandbox's browser broke: Chromium died, or its agent answered "
        "what is not its protocol or more than the server takes (browser_failed)",
    },
}
_SCRAPE_ERRORS: dict[int | str, dict[str, object]] = {
    **_ERRORS,
    400: {
        "model": ErrorBody,
        "description": "Invalid request, the message names the field (invalid_request); or "
        "an action could not be done, the message names it by index and type "
        "(browser_action_failed)",
    },
    503: {
        "model": ErrorBody,
        "description": "The sandbox's template has no Chromium, or no Markdown converter for "
        "a call asking for markdown (browser_unavailable); or the server holds its most bytes "
        "of browser answers at once, max_browser_buffered_bytes (server_at_capacity)",
    },
    504: {
        "model": ErrorBody,
        "description": "The scrape's timeout passed (browser_timeout)",
    },
}
_ONE_SHOT_ERRORS: dict[int | str, dict[str, object]] = {
    **{status: error for status, error in _SCRAPE_ERRORS.items() if status not in (404, 409)},
    **BUDGET_ERRORS,
    503: {
        "model": ErrorBody,
        "description": "The browser template has no Chromium or converter "
        "(browser_unavailable), or the server has no room for its sandbox or its answer "
        "now (server_at_capacity)",
    },
}


@router.post(
    "/{sandbox_id}/browser/scrape",
    response_model=ScrapeResult,
    responses=_SCRAPE_ERRORS,
    summary="Scrape a page in the sandbox's browser (kept open across calls: a session)",
)
async def scrape(
    sandbox_id: SandboxId, body: ScrapeRequest, caller: Caller, request: Request
) -> ScrapeResult:
    """Opens `url` (or, without it, acts on the page the browser has open), does the
    actions in order, and captures the page in `formats`. The browser starts on the first
    call (about 2 s) and stays open with its page, cookies and storage until it is closed
    or the sandbox ends. The page reaches only what the sandbox's egress policy allows; a
    page that does not load is no error: `metadata.error` and `metadata.status_code` say
    why. Everything in the result is the page's: untrusted."""
    return await deps.browser(request).scrape(caller.tenant, sandbox_id, body, actor=caller.key_id)


@router.get(
    "/{sandbox_id}/browser",
    response_model=BrowserStatus,
    responses=_ERRORS,
    summary="Whether the sandbox's browser runs, and the page it has open",
)
async def status(sandbox_id: SandboxId, caller: Caller, request: Request) -> BrowserStatus:
    """Nothing is started to answer: a sandbox whose browser never ran is `running: false`."""
    return await deps.browser(request).status(caller.tenant, sandbox_id)


@router.delete(
    "/{sandbox_id}/browser",
    response_model=BrowserStatus,
    responses=_ERRORS,
    summary="Close the sandbox's browser (its page, cookies and storage with it)",
)
async def close(sandbox_id: SandboxId, caller: Caller, request: Request) -> BrowserStatus:
    """The next scrape starts a fresh browser. Closing one that does not run is no error."""
    return await deps.browser(request).close(caller.tenant, sandbox_id, actor=caller.key_id)


@one_shot.post(
    "/scrape",
    response_model=ScrapeResult,
    responses=_ONE_SHOT_ERRORS,
    summary="Scrape a page in a sandbox of its own, killed afterwards",
)
async def scrape_once(body: ScrapeRequest, caller: Caller, request: Request) -> ScrapeResult:
    """`url` is required. The sandbox is of the server's browser template, taken from its
    warm pool when one is ready (else started: about 2 s more), with your tenant's egress
    policy; it counts in your tenant's budget while it runs and is killed once the scrape
    is over, whatever its outcome. `sandbox_id` names it (its audit records)."""
    return await deps.browser(request).one_shot(caller.tenant, body, actor=caller.key_id)
