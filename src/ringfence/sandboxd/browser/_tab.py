"""One tab: a page target attached in flattened mode, what its main frame did, and the page
operations the scrape engine is made of.

The tab's listener (on the CDP reader thread) keeps what the engine asks about: the main
frame's current document (``loaderId``), each document's HTTP status and URL (from
``Network.responseReceived``), whether the frame is loading, and how many loads it has
finished; waiters sleep on one condition. Our own page scripts (metadata, links, element
boxes, waits) run in an isolated world (``Page.createIsolatedWorld``): the page shares the
DOM with them but not its JavaScript globals, so it cannot redefine the built-ins they call.
A caller's own ``execute_javascript`` runs in the page's main world, as the page's code.
"""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import urlsplit

from ._cdp import Connection, Deadline, Expired, Gone, ProtocolError
from ._chromium import VIEWPORT

MAX_SCREENSHOT_HEIGHT = 16384
MAX_SCREENSHOT_WIDTH = 4096
_WORLD = "ringfence"
_KEEP_RESPONSES = 16
_GONE_CHECK = 0.25  # seconds


class PageGone(Exception):
    """The page's JavaScript context went away mid-call (it navigated)."""


class Tab:
    """A page target and its flattened CDP session."""

    def __init__(self, connection: Connection, target_id: str, session_id: str) -> None:
        self.connection = connection
        self.target_id = target_id
        self.session_id = session_id
        self._changed = threading.Condition()
        self.loader_id: str | None = None
        self.url: str | None = None
        self.requested = 0  # navigations of the main frame the page asked for
        self.started = 0  # loads of the main frame started
        self.stopped = 0  # loads of the main frame finished (or failed)
        self._lifecycle: tuple[str, set[str]] = ("", set())
        self._responses: dict[str, tuple[int, str, str | None]] = {}
        self._world: tuple[str | None, int] | None = None
        self._headers: tuple[str, dict[str, str]] | None = None  # (origin, headers)
        connection.listen(session_id, self._on_event)

    @classmethod
    def open(cls, connection: Connection, deadline: Deadline, *, fresh: bool = False) -> Tab:
        """Attach to Chromium's first page (a new one if ``fresh`` or it has none) and
        enable what the engine needs: page, network and crash events, the viewport."""
        pages = []
        if not fresh:
            targets = connection.call("Target.getTargets", deadline=deadline)
            pages = [t for t in targets.get("targetInfos", []) if t.get("type") == "page"]
        if pages:
            target_id = str(pages[0]["targetId"])
        else:
            created = connection.call(
                "Target.createTarget", {"url": "about:blank"}, deadline=deadline
            )
            target_id = str(created["targetId"])
        attached = connection.call(
            "Target.attachToTarget", {"targetId": target_id, "flatten": True}, deadline=deadline
        )
        tab = cls(connection, target_id, str(attached["sessionId"]))
        tab.call("Inspector.enable", deadline=deadline)
        tab.call("Page.enable", deadline=deadline)
        tab.call("Page.setLifecycleEventsEnabled", {"enabled": True}, deadline=deadline)
        tab.call("Network.enable", deadline=deadline)
        tab.call("Runtime.enable", deadline=deadline)
        width, height = VIEWPORT
        tab.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            deadline=deadline,
        )
        return tab

    def close(self, deadline: Deadline) -> None:
        """Close the target (through the browser, so a page stuck in a loop cannot stop
        it) and stop listening."""
        self.connection.listen(self.session_id, None)
        self.connection.call("Target.closeTarget", {"targetId": self.target_id}, deadline=deadline)

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, deadline: Deadline
    ) -> dict[str, Any]:
        return self.connection.call(method, params, session=self.session_id, deadline=deadline)

    def info(self, deadline: Deadline) -> dict[str, Any]:
        """The target's URL and title, from the browser (not the page's renderer)."""
        answer = self.connection.call(
            "Target.getTargetInfo", {"targetId": self.target_id}, deadline=deadline
        )
        info = answer.get("targetInfo")
        return info if isinstance(info, dict) else {}

    def scope_headers(self, own: str | None, headers: dict[str, str], deadline: Deadline) -> None:
        """Add ``headers`` to the tab's requests for origin ``own`` (``scheme://host:port``) and
        to no other: every request pauses (``Fetch.requestPaused``, on the reader thread)
        and goes on with them only when its own URL has that origin. A request to another
        origin (a third-party image, a redirect's next hop) goes on without them, names
        matched in any case, even when Chromium carried them across a redirect. No
        headers or no origin: nothing is intercepted."""
        wanted = (own, dict(headers)) if own and headers else None
        with self._changed:
            self._headers = wanted
        if wanted is None:
            self.call("Fetch.disable", deadline=deadline)
        else:
            self.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, deadline=deadline)

    def _continue(self, params: dict[str, Any]) -> None:
        request_id = params.get("requestId")
        request = params.get("request") or {}
        scoped = self._headers
        sent = {str(k): str(v) for k, v in (request.get("headers") or {}).items()}
        go: dict[str, Any] = {"requestId": request_id}
        if scoped is not None:
            own, extra = scoped
            names = {name.lower() for name in extra}
            kept = {k: v for k, v in sent.items() if k.lower() not in names}
            if origin(str(request.get("url", ""))) == own:
                kept.update(extra)
            if kept != sent:
                go["headers"] = [{"name": k, "value": v} for k, v in kept.items()]
        self.connection.send("Fetch.continueRequest", go, session=self.session_id)

    # What the main frame did

    def status(self) -> tuple[int | None, str | None]:
        """The current document's HTTP status and response URL, if it had a response."""
        with self._changed:
            found = self._responses.get(self.loader_id or "")
        return (found[0], found[1]) if found else (None, None)

    def progress(self) -> tuple[int, int, int, str | None]:
        """The main frame's navigations requested, loads started and stopped, and its
        current document, read together."""
        with self._changed:
            return self.requested, self.started, self.stopped, self.loader_id

    def refused(self) -> str | None:
        """Why the sandbox's egress proxy refused the current document, if it did (its
        answers carry ``Ringfence-Egress: refused``; a site that sends the header itself
        only marks its own page as not loaded)."""
        with self._changed:
            found = self._responses.get(self.loader_id or "")
        return found[2] if found else None

    def loaded(self, loader: str | None) -> bool:
        """Whether document ``loader`` (the current one when ``None``) fired its load
        event. Call it under the tab's lock (from ``wait``'s predicate)."""
        loader = self.loader_id if loader is None else loader
        return self._lifecycle[0] == loader and "load" in self._lifecycle[1]

    def wait(self, done: Any, deadline: Deadline) -> bool:
        """Wait until ``done()`` (called under the tab's lock) is true; False at the
        deadline. Raises ``Gone`` once the connection to Chromium has ended: a renderer
        the sandbox's OOM killer took mid-load (``Inspector.targetCrashed`` closes the
        connection) ends the wait then, not at the call's deadline. The pipe's end is not
        signalled on this condition, so the wait looks again every ``_GONE_CHECK`` s."""
        with self._changed:
            while not done():
                why = self.connection.gone
                if why is not None:
                    raise Gone(why)
                left = deadline.left()
                if left <= 0:
                    return False
                self._changed.wait(min(left, _GONE_CHECK))
            return True

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Fetch.requestPaused":
            self._continue(params)
            return
        main = params.get("frameId") == self.target_id
        with self._changed:
            if method == "Network.responseReceived":
                if params.get("type") == "Document" and main:
                    response = params.get("response") or {}
                    status = response.get("status")
                    loader = str(params.get("loaderId", ""))
                    if isinstance(status, int):
                        headers = response.get("headers") or {}
                        refused = any(
                            str(k).lower() == "ringfence-egress" and str(v).strip() == "refused"
                            for k, v in headers.items()
                        )
                        why = str(response.get("statusText") or "egress denied by Ringfence")
                        self._responses[loader] = (
                            status, str(response.get("url", "")), why[:300] if refused else None
                        )  # fmt: skip
                        while len(self._responses) > _KEEP_RESPONSES:
                            self._responses.pop(next(iter(self._responses)))
                return
            if method == "Page.frameNavigated":
                frame = params.get("frame") or {}
                if frame.get("id") == self.target_id and not frame.get("parentId"):
                    self.loader_id = str(frame.get("loaderId", ""))
                    self.url = str(frame.get("url", ""))
                    self._world = None
            elif method == "Page.navigatedWithinDocument" and main:
                self.url = str(params.get("url", self.url))
            elif method == "Page.lifecycleEvent" and main:
                loader, name = str(params.get("loaderId", "")), str(params.get("name", ""))
                if loader != self._lifecycle[0]:
                    self._lifecycle = (loader, set())
                self._lifecycle[1].add(name)
            elif method == "Page.frameRequestedNavigation" and main:
                self.requested += 1
            elif method == "Page.frameStartedLoading" and main:
                self.started += 1
            elif method == "Page.frameStoppedLoading" and main:
                self.stopped += 1
            elif method == "Page.javascriptDialogOpening":
                # A dialog would block the page's scripts (and so every call) until
                # answered: alerts and "leave this page?" are accepted, confirms and prompts
                # dismissed, as by a person who clicks through and agrees to nothing.
                accept = params.get("type") in ("alert", "beforeunload")
                self.connection.send(
                    "Page.handleJavaScriptDialog", {"accept": accept}, session=self.session_id
                )
                return
            elif method == "Inspector.targetCrashed":
                # A renderer killed (the sandbox's memory limit, most often): the agent
                # starts over with a fresh Chromium rather than nurse a half-dead one.
                self.connection.close("the page's renderer crashed (out of memory?)")
            elif method == "Runtime.executionContextsCleared":
                self._world = None
            else:
                return
            self._changed.notify_all()

    # Scripts

    def evaluate(self, expression: str, deadline: Deadline) -> Any:
        """The JSON value of ``expression`` (awaited) in our isolated world.

        Raises:
            PageGone: the page navigated while it ran.
            ScriptError: it threw.
        """
        for attempt in (1, 2):
            context = self._context(deadline)
            try:
                answer = self.call(
                    "Runtime.evaluate",
                    {
                        "expression": expression,
                        "contextId": context,
                        "returnByValue": True,
                        "awaitPromise": True,
                    },
                    deadline=deadline,
                )
            except ProtocolError as error:
                if attempt == 1 and _context_lost(error):
                    self._world = None
                    continue
                if _context_lost(error):
                    raise PageGone(error.text) from error
                raise
            return _value(answer)
        raise PageGone("the page's context kept changing")  # pragma: no cover

    def evaluate_main_world(self, script: str, deadline: Deadline) -> Any:
        """The JSON value of ``script`` (awaited) in the page's own main world."""
        try:
            answer = self.call(
                "Runtime.evaluate",
                {"expression": script, "returnByValue": True, "awaitPromise": True},
                deadline=deadline,
            )
        except ProtocolError as error:
            if _context_lost(error):
                raise PageGone(error.text) from error
            raise
        return _value(answer)

    def _context(self, deadline: Deadline) -> int:
        with self._changed:
            world = self._world
            loader = self.loader_id
        if world is not None and world[0] == loader:
            return world[1]
        created = self.call(
            "Page.createIsolatedWorld",
            {"frameId": self.target_id, "worldName": _WORLD, "grantUniveralAccess": False},
            deadline=deadline,
        )
        context = int(created["executionContextId"])
        with self._changed:
            self._world = (loader, context)
        return context

    # Input and capture

    def click_at(self, x: float, y: float, deadline: Deadline) -> None:
        base = {"x": x, "y": y, "button": "left", "clickCount": 1}
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y},
                  deadline=deadline)  # fmt: skip
        self.call("Input.dispatchMouseEvent", {"type": "mousePressed", **base}, deadline=deadline)
        self.call("Input.dispatchMouseEvent", {"type": "mouseReleased", **base}, deadline=deadline)

    def screenshot(self, full_page: bool, deadline: Deadline) -> str:
        """A base64 PNG of the viewport, or of the whole page (its first
        ``MAX_SCREENSHOT_HEIGHT`` CSS pixels down, ``MAX_SCREENSHOT_WIDTH`` across)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.call("Page.getLayoutMetrics", deadline=deadline)
            size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
            width = max(1, min(int(size.get("width", VIEWPORT[0])), MAX_SCREENSHOT_WIDTH))
            height = max(1, min(int(size.get("height", VIEWPORT[1])), MAX_SCREENSHOT_HEIGHT))
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
            params["captureBeyondViewport"] = True
        answer = self.call("Page.captureScreenshot", params, deadline=deadline)
        return str(answer.get("data", ""))


class ScriptError(Exception):
    """A script threw; the message is the exception's description."""


def navigated(error: ProtocolError) -> bool:
    """Whether ``error`` says the page navigated away while a command ran."""
    return "navigated or closed" in error.text.lower()


def _context_lost(error: ProtocolError) -> bool:
    text = error.text.lower()
    lost = "context" in text and ("destroyed" in text or "cannot find" in text)
    return lost or navigated(error)


def _value(answer: dict[str, Any]) -> Any:
    details = answer.get("exceptionDetails")
    if isinstance(details, dict):
        exception = details.get("exception") or {}
        text = exception.get("description") or details.get("text") or "the script threw"
        raise ScriptError(str(text)[:2000])
    result = answer.get("result") or {}
    if "value" in result:
        return result["value"]
    if "unserializableValue" in result:
        return str(result["unserializableValue"])
    return None


def origin(url: str) -> str | None:
    """``url``'s origin as ``scheme://host:port`` (the port always written), or ``None``
    for a URL with no network origin."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        return None
    return f"{scheme}://{host}:{port or (443 if scheme == 'https' else 80)}"


def encoded_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


__all__ = ["MAX_SCREENSHOT_HEIGHT", "Expired", "Gone", "PageGone", "ScriptError", "Tab", "origin"]
