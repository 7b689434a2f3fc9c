"""``AsyncBrowser``: a sandbox's browser from the SDK (``sbx.browser``), and the pure
helpers the one-shot ``rf.browser.scrape`` shares with it (docs/browser.md).

    async with await AsyncSandbox.create("browser", limits={"memory": "1536M"}) as sbx:
        page = await sbx.browser.scrape("https://example.com", formats=["markdown"])
        print(page.markdown)
        login = await sbx.browser.scrape(actions=[{"type": "click", "selector": "#go"}])

The sandbox's browser stays open across calls (a session): a scrape without ``url`` acts
on and captures the page it has open. Everything a scrape returns is the page's: untrusted.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import TypeAdapter

from ringfence.client._link import Link
from ringfence.errors import InvalidRequest, SandboxError
from ringfence.models import problems
from ringfence.models.browser import (
    Action,
    ActionResult,
    BrowserStatus,
    Cookie,
    FirewallRule,
    ScrapeFormat,
    ScrapeRequest,
    ScrapeResult,
)

__all__ = [
    "ActionInput",
    "AsyncBrowser",
    "CdpEndpoint",
    "CookieInput",
    "FormatInput",
    "RuleInput",
    "decode_png",
    "parse_action",
    "scrape_request",
    "scrape_seconds",
]

ActionInput = Action | Mapping[str, Any]
CookieInput = Cookie | Mapping[str, Any]
FormatInput = ScrapeFormat | str
RuleInput = FirewallRule | str

# What an HTTP call waits beyond the scrape's own ``timeout``: the server's hop to the
# sandbox, Chromium's cold start, a one-shot's sandbox from the pool (or made anew).
_MARGIN_SECONDS = 60.0
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_ACTION: TypeAdapter[Action] = TypeAdapter(Action)


@dataclass(frozen=True)
class CdpEndpoint:
    """Where a Chrome DevTools Protocol client reaches a sandbox's Chromium, through the
    server: ``url`` (ws:// or wss://) and the ``headers`` to send with the WebSocket
    handshake (your key)::

        cdp = sbx.browser.cdp_url()
        browser = await playwright.chromium.connect_over_cdp(cdp.url, headers=cdp.headers)
    """

    url: str
    headers: dict[str, str] = field(repr=False)  # the key: never printed by accident

    def __str__(self) -> str:
        return self.url


def parse_action(action: ActionInput) -> Action:
    """An action from its model or its JSON form (``{"type": "click", "selector": "#go"}``).

    Raises:
        InvalidRequest: not a valid action (the message names the field).
    """
    if isinstance(action, Mapping):
        try:
            return _ACTION.validate_python(dict(action))
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise InvalidRequest(f"action: {problems(exc)}") from exc
    return action


def scrape_request(
    url: str | None,
    *,
    formats: Sequence[FormatInput] | None = None,
    actions: Iterable[ActionInput] | None = None,
    only_main_content: bool = True,
    wait_for: int = 0,
    timeout: int = 30_000,
    headers: Mapping[str, str] | None = None,
    cookies: Iterable[CookieInput] | None = None,
    firewall: Iterable[RuleInput] | None = None,
) -> ScrapeRequest:
    """A scrape, checked before anything is sent. ``formats`` None: Markdown only;
    ``firewall`` None: every rule, ``[]``: none.

    Raises:
        InvalidRequest: a field is invalid (a URL that is not http(s), an unknown format or
            rule, an action without its selector...).
    """
    fields: dict[str, Any] = {
        "url": url, "only_main_content": only_main_content, "wait_for": wait_for,
        "timeout": timeout, "headers": dict(headers or {}),
        "actions": [parse_action(a) for a in actions or ()],
        "cookies": [c if isinstance(c, Cookie) else dict(c) for c in cookies or ()],
    }  # fmt: skip
    if formats is not None:
        fields["formats"] = [_text(f) for f in formats]
    if firewall is not None:
        fields["firewall"] = [_text(r) for r in firewall]
    try:
        return ScrapeRequest.model_validate(fields)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidRequest(problems(exc)) from exc


def _text(value: object) -> object:
    """A format's or a rule's value: the enum's, else what was given (validated later)."""
    return value.value if isinstance(value, (ScrapeFormat, FirewallRule)) else value


def scrape_seconds(request: ScrapeRequest) -> float:
    """How long the HTTP call of ``request`` may take: its own ``timeout`` and a margin, so
    the scrape's deadline (answered as an error) always comes first."""
    return request.timeout / 1000 + _MARGIN_SECONDS


def decode_png(data: str | ScrapeResult | ActionResult) -> bytes:
    """A screenshot's PNG bytes: of a result (its ``screenshot``), an action's result, or
    the base64 text itself.

    Raises:
        InvalidRequest: the result has no screenshot (ask for the ``screenshot`` format).
        SandboxError: what came back is not a base64 PNG.
    """
    encoded = data if isinstance(data, str) else data.screenshot
    if encoded is None:
        raise InvalidRequest("this result has no screenshot: ask for the screenshot format")
    try:
        png = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SandboxError(f"the screenshot is not base64: {exc}") from exc
    if not png.startswith(_PNG_MAGIC):
        raise SandboxError("the screenshot is not a PNG")
    return png


def cdp_endpoint(base_url: str, sandbox_id: str, headers: Mapping[str, str]) -> CdpEndpoint:
    """The CDP WebSocket of ``sandbox_id`` on the server at ``base_url``."""
    parts = urlsplit(base_url.rstrip("/"))
    scheme = "wss" if parts.scheme == "https" else "ws"
    path = f"{parts.path}/v1/sandboxes/{quote(sandbox_id, safe='')}/browser/cdp"
    return CdpEndpoint(urlunsplit((scheme, parts.netloc, path, "", "")), dict(headers))


class AsyncBrowser:
    """The browser of one sandbox (``sbx.browser``): it starts on the first call that
    needs it and stays open, with its page, until ``close`` or the sandbox's end. The
    sandbox needs a template with Chromium (``browser``) and room for it: memory of 1 GiB
    or more, pids 512 or more."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def scrape(
        self,
        url: str | None = None,
        *,
        formats: Sequence[FormatInput] | None = None,
        actions: Iterable[ActionInput] | None = None,
        only_main_content: bool = True,
        wait_for: int = 0,
        timeout: int = 30_000,
        headers: Mapping[str, str] | None = None,
        cookies: Iterable[CookieInput] | None = None,
        firewall: Iterable[RuleInput] | None = None,
    ) -> ScrapeResult:
        """Open ``url`` (None: stay on the open page), do ``actions`` in order, and capture
        the page in ``formats`` (default ``["markdown"]``; also ``html``, ``raw_html``,
        ``screenshot``, ``screenshot@full_page``, ``links``).

        ``actions``: models of ``ringfence.models.browser`` or their JSON form
        (``{"type": "write", "text": "alice"}``). ``only_main_content``: leave out
        navigation, headers, footers. ``wait_for``: milliseconds to wait after load.
        ``timeout``: milliseconds for the whole call. ``headers``, ``cookies``: sent with
        the page's requests. ``firewall``: the semantic firewall's rules (default all;
        ``[]`` for none): what it removed is ``result.firewall``. A page that did not load
        is no error: ``result.metadata.error`` says why.

        Raises:
            InvalidRequest: a bad argument (checked before sending).
            BrowserActionFailed: an action could not be done (no element matches its
                selector, a script threw); the message names it.
            BrowserTimeout: the call's ``timeout`` passed.
            BrowserUnavailable: the sandbox's template has no Chromium (use ``browser``).
            BrowserError: Chromium died (a page at the memory limit) or broke its protocol;
                the next call starts a fresh one.
            SandboxNotFound, SandboxNotRunning, ServerUnreachable.
        """
        request = scrape_request(
            url, formats=formats, actions=actions, only_main_content=only_main_content,
            wait_for=wait_for, timeout=timeout, headers=headers, cookies=cookies,
            firewall=firewall,
        )  # fmt: skip
        body = request.model_dump(mode="json", exclude_none=True)
        answer = await self._link.rest(
            "POST", "/browser/scrape", body, timeout=scrape_seconds(request)
        )
        return ScrapeResult.model_validate(answer)

    async def status(self) -> BrowserStatus:
        """Whether its browser runs, and the page it has open. Raises ``SandboxNotFound``."""
        return BrowserStatus.model_validate(await self._link.rest("GET", "/browser"))

    async def close(self) -> BrowserStatus:
        """End its browser (its page, cookies and profile with it); the next scrape starts
        a fresh one. Closing a browser that does not run is no error.

        Raises:
            SandboxNotFound, SandboxNotRunning.
        """
        answer = await self._link.rest("DELETE", "/browser")
        return (
            BrowserStatus(running=False) if answer is None else BrowserStatus.model_validate(answer)
        )

    def cdp_url(self) -> CdpEndpoint:
        """The WebSocket URL of the sandbox's Chromium over the Chrome DevTools Protocol
        (``/v1/sandboxes/{id}/browser/cdp``), and the headers a CDP client sends with it:
        ``playwright.chromium.connect_over_cdp(cdp.url, headers=cdp.headers)``. The browser
        is started when a client connects. Nothing is sent here."""
        return cdp_endpoint(
            self._link.settings.url, self._link.sandbox_id, self._link.settings.headers()
        )
