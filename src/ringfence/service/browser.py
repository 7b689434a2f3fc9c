"""Browsers in sandboxes, for tenants: scrapes, sessions, one-shot scrapes (docs/browser.md).

A sandbox's browser is its agent's (``service.browser_agent``), started on the first call
that needs it and kept: the page it has open stays open across calls (a session) until it
is closed or the sandbox ends. Every call first finds the sandbox in the caller's tenant
(``SandboxNotFound`` for another tenant's, as everywhere) and wakes it as any request
does (a paused sandbox is resumed); a scrape counts as use for ``auto_pause`` for as long
as it runs.

A one-shot scrape renders in a sandbox of its own, of ``Config.browser_template``: one
claimed from the warm pool when one is ready, else one started with the browser limits
(``browser_memory``, ``browser_pids``). It is the tenant's sandbox like any (its budget
counts it, its network defaults are its egress policy) and is killed once the scrape is
over, however it ended: done, failed, or given up by its client.

The audit record: ``browser.scrape`` (the URL, the formats, the actions' types, the names
of the headers and cookies; never a header's or cookie's value, a typed text or a
script), with how it ended; ``browser.close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from ringfence.audit.chain import SYSTEM
from ringfence.audit.redact import loggable, redacted_url
from ringfence.config import Config
from ringfence.errors import BrowserUnavailable, InvalidRequest, RingfenceError
from ringfence.models import SandboxSpec
from ringfence.models.browser import BrowserStatus, ScrapeRequest, ScrapeResult
from ringfence.service.browser_agent import CALL_MARGIN_SECONDS, START_SECONDS, BrowserAgent
from ringfence.service.sandboxes import SandboxService
from ringfence.templates import TemplateNotFound

__all__ = ["BrowserService", "audited"]

log = logging.getLogger(__name__)

# A running scrape counts as use this often (auto_pause's idle clock): a quarter of the
# shortest auto_pause there is (1 s), so none pauses a sandbox mid-scrape. A touch is a store
# of the loop's time; four a second cost nothing.
_TOUCH_SECONDS = 0.25
# A one-shot sandbox's own deadline, past its scrape's: a safety net should its kill fail.
_ONE_SHOT_SLACK_SECONDS = 60.0


class BrowserService:
    """Scrapes in tenants' sandboxes. Every method may raise what finding the sandbox
    raises (``SandboxNotFound``, ``SandboxNotRunning``, what a resume raises), what reaching
    its daemon raises (``SandboxError``) and ``BrowserError`` (502) for a browser that
    broke or an agent that does not speak its protocol."""

    def __init__(self, sandboxes: SandboxService, config: Config, agent: BrowserAgent) -> None:
        self._sandboxes = sandboxes
        self._config = config
        self._agent = agent
        self._killing: set[asyncio.Task[None]] = set()  # one-shot sandboxes being killed

    async def scrape(
        self, tenant: str, sandbox_id: str, request: ScrapeRequest, *, actor: str = SYSTEM
    ) -> ScrapeResult:
        """Scrape in the sandbox's browser (started if need be): open ``request.url``, or
        act on the page it has open when there is none.

        Raises:
            BrowserActionFailed: an action could not be done (400).
            BrowserTimeout: the request's timeout passed (504).
            BrowserUnavailable: the sandbox's template has no Chromium, or no Markdown
                converter for a call asking for Markdown (503).
        """
        daemon = await self._sandboxes.daemon(tenant, sandbox_id)
        details = audited(request)
        outcome = "failed"
        try:
            with self._in_use(sandbox_id):
                result = await self._agent.scrape(daemon, request)
            outcome = "ok"
        except RingfenceError as exc:
            details["error"] = exc.code
            raise
        finally:  # also when its client went away (cancelled): it reached the sandbox
            self._sandboxes.record(tenant, actor, "browser.scrape", sandbox_id, outcome, details)
        return result.model_copy(update={"sandbox_id": sandbox_id})

    async def status(self, tenant: str, sandbox_id: str) -> BrowserStatus:
        """Whether the sandbox's browser runs, and the page it has open (nothing is started
        to tell)."""
        daemon = await self._sandboxes.daemon(tenant, sandbox_id)
        return await self._agent.status(daemon)

    async def close(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> BrowserStatus:
        """End the sandbox's browser (its page, cookies and storage with it); a browser that
        does not run is closed already."""
        daemon = await self._sandboxes.daemon(tenant, sandbox_id)
        outcome = "failed"
        try:
            status = await self._agent.close(daemon)
            outcome = "ok"
        finally:
            self._sandboxes.record(tenant, actor, "browser.close", sandbox_id, outcome)
        return status

    async def cdp_path(self, tenant: str, sandbox_id: str) -> str:
        """The WebSocket path of the sandbox's browser target on its ``CDP_PORT``
        (``/devtools/browser/<id>``), the browser started first if need be.

        Raises:
            BrowserUnavailable: the sandbox's template has no Chromium.
        """
        daemon = await self._sandboxes.daemon(tenant, sandbox_id)
        return await self._agent.cdp_path(daemon)

    async def one_shot(
        self, tenant: str, request: ScrapeRequest, *, actor: str = SYSTEM
    ) -> ScrapeResult:
        """Scrape ``request.url`` in a new sandbox of the browser template (from the warm
        pool when one is ready), killed afterwards whatever happens (the kill starts as the
        scrape ends; the answer does not wait for it: ``settled`` does); the result names
        it.

        Raises:
            InvalidRequest: no ``url``.
            BrowserUnavailable: this server has no browser template (503).
            TooManyRequests, ServerAtCapacity: no room for the sandbox now.
            SandboxError: the sandbox could not start.
            BrowserActionFailed, BrowserTimeout, BrowserUnavailable: as ``scrape``.
        """
        if request.url is None:
            raise InvalidRequest("url: a one-shot scrape opens a page: give its url")
        config = self._config
        try:
            self._sandboxes.image_for(config.browser_template)
        except TemplateNotFound as exc:  # the operator's to build: not the caller's input
            raise BrowserUnavailable(
                f"this server has no browser template {config.browser_template!r} "
                f"(ringfence template build {config.browser_template} --recipe browser): "
                f"{exc.message}"
            ) from exc
        deadline = (
            request.timeout / 1000 + CALL_MARGIN_SECONDS + START_SECONDS + _ONE_SHOT_SLACK_SECONDS
        )
        spec = SandboxSpec(  # the template's own limits (browser_memory, browser_pids)
            template=config.browser_template,
            timeout=min(deadline, config.max_timeout),
            metadata={"ringfence": "one-shot browser scrape"},
        )
        sandbox = await self._sandboxes.create(tenant, spec, actor=actor)
        try:
            return await self.scrape(tenant, sandbox.id, request, actor=actor)
        finally:  # a task of its own: a client that goes away cancels the scrape, never the
            # kill, and the answer does not wait for it (50-150 ms here)
            killing = asyncio.create_task(self._kill(tenant, sandbox.id, actor))
            self._killing.add(killing)
            killing.add_done_callback(self._killing.discard)

    async def settled(self) -> None:
        """Wait until the one-shot sandboxes being killed are (tests, shutdown)."""
        while self._killing:
            await asyncio.gather(*self._killing, return_exceptions=True)

    async def _kill(self, tenant: str, sandbox_id: str, actor: str) -> None:
        try:
            await self._sandboxes.kill(tenant, sandbox_id, actor=actor)
        except RingfenceError as exc:  # ended already (its limits), or the kill failed
            log.warning(
                "one-shot browser sandbox %s: its kill: %s", sandbox_id, loggable(exc.message)
            )

    @contextlib.contextmanager
    def _in_use(self, sandbox_id: str) -> Iterator[None]:
        """Count the sandbox as used (``auto_pause``) while the block runs."""

        async def touching() -> None:
            while True:
                self._sandboxes.touch(sandbox_id)
                await asyncio.sleep(_TOUCH_SECONDS)

        toucher = asyncio.create_task(touching())
        try:
            yield
        finally:
            toucher.cancel()
            self._sandboxes.touch(sandbox_id)


def audited(request: ScrapeRequest) -> dict[str, object]:
    """What the audit record keeps of a scrape: what it opened and did, never a value it
    sent (header and cookie values, typed text, scripts may be secrets; the URL without
    its userinfo, query values and fragment: ``audit.redact``)."""
    details: dict[str, object] = {
        "url": None if request.url is None else redacted_url(request.url),
        "formats": [str(f) for f in request.formats],
        "actions": [action.type for action in request.actions],
    }
    if request.headers:
        details["headers"] = sorted(request.headers)
    if request.cookies:
        details["cookies"] = sorted({cookie.name for cookie in request.cookies})
    return details
