"""The scrape engine: one ``ScrapeRequest`` played on one tab, answered as a
``ScrapeResult``'s JSON.

In order: the request's headers and cookies, the navigation (when there is a ``url``) and
its load event, ``wait_for``, the actions, then the capture in the request's formats. Every
wait is bounded by the call's deadline (``Expired`` escapes to the session, which answers
``timeout``). Waits for an element (``wait`` with a selector, ``click``, ``scroll`` of an
element) keep back a reserve of the call's time for the capture, so a selector that never
appears ends in ``action_failed`` naming it, not in a timeout. An action that navigates (a
form submitted by a click or by Enter) is followed by a wait for that navigation's load
event, so the next step sees the new page.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any
from urllib.parse import urlsplit

from . import _scripts
from ._cdp import Deadline, Expired, ProtocolError
from ._errors import AgentError
from ._request import Action, ScrapeRequest
from ._tab import PageGone, ScriptError, Tab, encoded_size, navigated, origin

MAX_SCRIPT_VALUE = 1024 * 1024
KEY_BY_KEY = 256  # longer texts are inserted at once (two round trips a key add up)
_FIREWALLED = ("markdown", "html")


def scrape(tab: Tab, request: ScrapeRequest, deadline: Deadline) -> dict[str, Any]:
    """Run ``request`` on ``tab``; the result's JSON.

    Raises:
        AgentError: an action failed, or the converter is missing.
        Expired: ``deadline`` passed.
        Gone: Chromium went away.
    """
    begun = time.monotonic()
    run = _Run(tab, request, deadline)
    target = origin(request.url or tab.url or "")
    if request.headers and target is None:
        raise AgentError("invalid_request", "headers: no http(s) page to send them to")
    try:  # only to the page's own origin (Tab.scope_headers): often they are credentials
        tab.scope_headers(target, request.headers, deadline)
    except ProtocolError as refused:
        raise AgentError("invalid_request", f"headers: {refused.text}") from refused
    if request.cookies:
        run.set_cookies()
    failed = run.navigate(request.url) if request.url is not None else None
    if request.wait_for:
        run.sleep(request.wait_for)
    results: list[dict[str, Any]] = []
    if failed is None:
        for index, action in enumerate(request.actions):
            results.append(run.act(index, action))
    capture, report = run.capture(request.formats)
    metadata = run.metadata()
    if failed is not None:  # what the page shows is Chromium's error page, not the site's
        metadata.update(error=failed, url=request.url, title=None, description=None,
                        language=None)  # fmt: skip
    result: dict[str, Any] = {
        "untrusted": True,
        "markdown": capture.get("markdown"),
        "html": capture.get("html"),
        "raw_html": capture.get("raw_html"),
        "screenshot": capture.get("screenshot"),
        "links": capture.get("links"),
        "metadata": metadata,
        "actions": results,
        "firewall": report or run.empty_report(),
        "sandbox_id": None,
        "elapsed_ms": round((time.monotonic() - begun) * 1000, 1),
    }
    return result


class _Run:
    def __init__(self, tab: Tab, request: ScrapeRequest, deadline: Deadline) -> None:
        self.tab = tab
        self.request = request
        self.deadline = deadline
        self.reserve = min(5.0, request.timeout / 4000)
        self.report: dict[str, Any] | None = None

    # Before the page

    def set_cookies(self) -> None:
        page = self.request.url or self.tab.url or ""
        cookies = []
        for cookie in self.request.cookies:
            entry: dict[str, Any] = {
                "name": cookie.name,
                "value": cookie.value,
                "path": cookie.path,
                "secure": cookie.secure,
                "httpOnly": cookie.http_only,
            }
            if cookie.domain:
                entry["domain"] = cookie.domain
            elif urlsplit(page).scheme in ("http", "https"):
                parts = urlsplit(page)
                entry["url"] = f"{parts.scheme}://{parts.netloc}{cookie.path}"
            else:
                raise AgentError(
                    "invalid_request",
                    f"cookies: {cookie.name!r} names no domain and no page gives one",
                )
            cookies.append(entry)
        try:
            self.tab.call("Network.setCookies", {"cookies": cookies}, deadline=self.deadline)
        except ProtocolError as error:
            raise AgentError("invalid_request", f"cookies: {error.text}") from error

    def navigate(self, url: str) -> str | None:
        """Open ``url`` and wait for its load event; why it failed, or ``None``."""
        tab = self.tab
        try:
            answer = tab.call("Page.navigate", {"url": url}, deadline=self.deadline)
        except ProtocolError as error:
            return error.text or "the URL could not be opened"
        loader = answer.get("loaderId")
        failed = answer.get("errorText") or None
        loaded = lambda: tab.loader_id == loader and tab.loaded(loader)  # noqa: E731
        if loader and not tab.wait(loaded, self.deadline):
            raise Expired(f"waiting for {url} to load")
        if failed:
            return str(failed)
        return tab.refused()  # an http:// page the egress proxy answered for

    # Actions

    def act(self, index: int, action: Action) -> dict[str, Any]:
        kind = action.type
        where = f"actions[{index}] ({kind})"
        result: dict[str, Any] = {"type": kind}
        try:
            if kind == "wait":
                if action["milliseconds"] is not None:
                    self.sleep(action["milliseconds"])
                else:
                    self.find(action["selector"], where, scroll=False)
            elif kind == "click":
                self.navigating_after(lambda: self.click(action["selector"], where))
            elif kind == "write":
                self.write(action["text"])
            elif kind == "press":
                self.navigating_after(lambda: self.press(action["key"], where))
            elif kind == "scroll":
                if action["selector"] is not None:
                    self.find(action["selector"], where, scroll=False)
                self.evaluate(_scripts.scroll(action["selector"], action["direction"]), where)
            elif kind == "screenshot":
                result["screenshot"] = self.tab.screenshot(action["full_page"], self.deadline)
            elif kind == "scrape":
                formats = [f for f in self.request.formats if f in ("markdown", "html", "raw_html")]
                capture, _ = self.capture(tuple(formats or ["raw_html"]))
                result.update(capture)
            elif kind == "execute_javascript":
                result["value"] = self.execute(action["script"], where)
        except ProtocolError as error:
            raise AgentError("action_failed", f"{where}: {error.text}") from error
        return result

    def click(self, selector: str, where: str) -> None:
        point = self.find(selector, where, scroll=True)
        self.tab.click_at(float(point["x"]), float(point["y"]), self.deadline)

    def write(self, text: str) -> None:
        """Type ``text`` into the focused element key by key (keydown, keypress, input,
        keyup for each, as a person's typing makes), or insert it at once past
        ``KEY_BY_KEY`` characters or for characters no key makes."""
        events = [_scripts.key_event("Enter" if c == "\n" else c) for c in text]
        if len(text) > KEY_BY_KEY or any(e is None for e in events):
            self.tab.call("Input.insertText", {"text": text}, deadline=self.deadline)
            return
        for event in events:
            assert event is not None
            self.key(event)

    def press(self, key: str, where: str) -> None:
        event = _scripts.key_event(key)
        if event is None:
            raise AgentError("action_failed", f"{where}: {key!r} is not a key the agent knows")
        self.key(event)

    def key(self, event: dict[str, object]) -> None:
        down = "keyDown" if "text" in event else "rawKeyDown"
        self.tab.call("Input.dispatchKeyEvent", {"type": down, **event}, deadline=self.deadline)
        up = {k: v for k, v in event.items() if k not in ("text", "unmodifiedText")}
        self.tab.call("Input.dispatchKeyEvent", {"type": "keyUp", **up}, deadline=self.deadline)

    def find(self, selector: str, where: str, *, scroll: bool) -> dict[str, Any]:
        budget = max(0, int((self.deadline.left() - self.reserve) * 1000))
        point = self.evaluate(_scripts.find(selector, budget, scroll), where)
        if not isinstance(point, dict):
            raise AgentError(
                "action_failed", f"{where}: no visible element matches {selector!r} "
                f"(waited {budget} ms)"
            )  # fmt: skip
        return point

    def navigating_after(self, do: Any) -> None:
        """Do an input action; if it started a navigation of the page, wait (bounded) for
        the new document's load event."""
        tab = self.tab
        requested, started, stopped, loader = tab.progress()
        try:
            do()
        except ProtocolError as error:
            if not navigated(error):  # the input was delivered; its page is gone
                raise
        with contextlib.suppress(PageGone, ScriptError):
            tab.evaluate(_scripts.SETTLE, self.deadline)
        bound = self.deadline.sooner(max(0.0, self.deadline.left() - self.reserve))
        if tab.requested > requested and tab.started == started:
            tab.wait(lambda: tab.started > started, bound.sooner(2.0))
        if tab.started > started:
            # Done when the frame stopped loading and, if a new document came (not a
            # download, not a 204), that document fired its load event.
            tab.wait(
                lambda: tab.stopped > stopped and (tab.loader_id == loader or tab.loaded(None)),
                bound,
            )

    def sleep(self, milliseconds: int) -> None:
        seconds = milliseconds / 1000
        if seconds > self.deadline.left():
            time.sleep(max(0.0, self.deadline.left()))
            raise Expired(f"waiting {milliseconds} ms")
        time.sleep(seconds)

    def execute(self, script: str, where: str) -> Any:
        try:
            value = self.tab.evaluate_main_world(script, self.deadline)
        except ScriptError as error:
            raise AgentError("action_failed", f"{where}: the script threw: {error}") from error
        except PageGone as error:
            raise AgentError("action_failed", f"{where}: the page navigated away") from error
        if encoded_size(value) > MAX_SCRIPT_VALUE:
            raise AgentError(
                "action_failed", f"{where}: its value exceeds {MAX_SCRIPT_VALUE} bytes as JSON"
            )
        return value

    def evaluate(self, expression: str, where: str) -> Any:
        try:
            return self.tab.evaluate(expression, self.deadline)
        except ScriptError as error:
            raise AgentError("action_failed", f"{where}: {error}") from error
        except PageGone as error:
            raise AgentError("action_failed", f"{where}: the page navigated away") from error

    # The capture

    def capture(self, formats: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        out: dict[str, Any] = {}
        report: dict[str, Any] | None = None
        firewalled = "links" in formats and bool(self.request.firewall)
        if firewalled or any(f in _FIREWALLED for f in formats):
            cleaned, report = self.firewall()
            if "html" in formats:
                out["html"] = cleaned
            if "markdown" in formats:
                out["markdown"] = _markdown(cleaned)
        if "raw_html" in formats:
            out["raw_html"] = self.evaluate(_scripts.RAW_HTML, "raw_html")
        if "links" in formats and firewalled:  # only the links a person could see
            out["links"] = _scripts.links_in(cleaned)
        elif "links" in formats:
            out["links"] = self.evaluate(_scripts.LINKS, "links")
        if "screenshot@full_page" in formats or "screenshot" in formats:
            full = "screenshot@full_page" in formats
            out["screenshot"] = self.tab.screenshot(full, self.deadline)
        return out, report

    def firewall(self) -> tuple[str, dict[str, Any]]:
        try:
            from ._firewall import script
        except ImportError as error:
            raise AgentError("unavailable", "this agent has no semantic firewall") from error
        try:
            expression = script(list(self.request.firewall), self.request.only_main_content)
        except OSError as error:
            raise AgentError("unavailable", f"the semantic firewall is missing: {error}") from error
        value = self.evaluate(expression, "firewall")
        if not isinstance(value, dict) or not isinstance(value.get("html"), str):
            raise AgentError("browser_failed", "the semantic firewall returned no HTML")
        removed = value.get("removed")
        removed = removed if isinstance(removed, dict) else {}
        report = {
            "rules": list(self.request.firewall),
            "removed": {str(k): int(v) for k, v in removed.items()},
            "removed_chars": int(value.get("removed_chars") or 0),
        }
        return value["html"], report

    def empty_report(self) -> dict[str, Any]:
        return {"rules": list(self.request.firewall), "removed": {}, "removed_chars": 0}

    def metadata(self) -> dict[str, Any]:
        found = self.evaluate(_scripts.METADATA, "metadata")
        found = found if isinstance(found, dict) else {}
        status, response_url = self.tab.status()
        url = found.get("url") or response_url or self.tab.url or "about:blank"
        return {  # every string the page set is bounded (_scripts.MAX_*)
            "url": _scripts.bounded(url, _scripts.MAX_URL),
            "source_url": self.request.url,
            "status_code": status,
            "title": _scripts.bounded(found.get("title"), _scripts.MAX_TEXT),
            "description": _scripts.bounded(found.get("description"), _scripts.MAX_TEXT),
            "language": _scripts.bounded(found.get("language"), _scripts.MAX_LANGUAGE),
            "error": None,
        }


def _markdown(html: str) -> str:
    try:
        from ._markdown import ConverterMissing, to_markdown
    except ImportError as error:
        raise AgentError("unavailable", "this agent has no Markdown converter") from error
    try:
        return str(to_markdown(html))
    except ConverterMissing as error:
        raise AgentError("unavailable", f"the Markdown converter is missing: {error}") from error
