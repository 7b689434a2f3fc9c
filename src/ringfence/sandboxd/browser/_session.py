"""The session: one Chromium and one tab, kept across calls, and what the wire protocol's
calls do with them.

Chromium starts on the first call that needs it. Its tab stays open between calls (a call
without ``url`` acts on it). A call whose deadline passes answers ``timeout`` and leaves
the tab to ``recover``: it is replaced by a fresh one (the stuck page closed), or, if even
that does not work in a few seconds, Chromium is ended. A Chromium that died, or whose
renderer crashed (a page hitting the sandbox's memory limit), answers ``browser_failed``
and is ended; the next call starts a fresh one. Callers hold one lock around each call:
the session is not thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._cdp import Connection, Deadline, Expired, Gone, ProtocolError
from ._chromium import Chromium, launch
from ._errors import AgentError
from ._request import ScrapeRequest
from ._scrape import scrape
from ._tab import Tab

START_SECONDS = 60.0
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024  # one download past it is cancelled (its file removed)
_RECOVER_SECONDS = 5.0


class Session:
    def __init__(self, chromium: str, cdp_port: int, env: Mapping[str, str]) -> None:
        self.chromium_path = chromium
        self.cdp_port = cdp_port
        self.env = dict(env)
        self.chromium: Chromium | None = None
        self.tab: Tab | None = None
        self.stale = False  # the tab timed out: replace it before its next use

    def status(self) -> dict[str, Any]:
        """``BrowserStatus``'s JSON."""
        chromium = self.chromium
        if chromium is None or not chromium.alive():
            return {"running": False, "url": None, "title": None, "pid": None}
        url = title = None
        if self.tab is not None and not self.stale:
            try:
                info = self.tab.info(Deadline(5.0))
                url, title = info.get("url"), info.get("title") or None
            except (Expired, Gone, ProtocolError):
                pass
        return {"running": True, "url": url, "title": title, "pid": chromium.pid}

    def start(self, deadline: Deadline) -> Tab:
        """The session's tab, Chromium (re)started first if it is not running.

        Raises:
            AgentError: ``unavailable`` (no Chromium), ``browser_failed`` (it would not
            start), ``timeout``.
        """
        if self.chromium is not None and not self._answers():
            self.end()
        if self.stale:
            self.recover()
        if self.chromium is None:
            try:
                self.chromium = launch(self.chromium_path, self.cdp_port, self.env)
            except FileNotFoundError as error:
                raise AgentError(
                    "unavailable", f"Chromium is not installed at {self.chromium_path}"
                ) from error
            except OSError as error:
                raise AgentError("browser_failed", f"Chromium did not start: {error}") from error
        if self.tab is None:
            started = deadline.sooner(START_SECONDS)
            try:
                self._prepare(self.chromium, started)
                self.tab = Tab.open(self.chromium.connection, started)
            except Expired as error:
                self.end()
                raise AgentError("timeout", "Chromium did not start in time") from error
            except (Gone, ProtocolError) as error:
                raise self._failed(error) from error
        return self.tab

    def scrape(self, request: ScrapeRequest) -> dict[str, Any]:
        """Play ``request`` on the session's tab.

        Raises:
            AgentError: every failure (the package docstring's table).
        """
        deadline = Deadline(request.timeout / 1000)
        tab = self.start(deadline)
        try:
            return scrape(tab, request, deadline)
        except Expired as error:
            self.stale = True
            raise AgentError(
                "timeout", f"the call's timeout of {request.timeout} ms passed ({error})"
            ) from error
        except Gone as error:
            raise self._failed(error) from error
        except ProtocolError as error:
            self.stale = True  # Chromium refused something: start over with a fresh tab
            raise AgentError("browser_failed", f"Chromium refused {error}") from error

    def devtools_path(self) -> str:
        self.start(Deadline(START_SECONDS))
        assert self.chromium is not None
        path = self.chromium.devtools_path(Deadline(10.0))
        if path is None:
            raise AgentError("browser_failed", "Chromium did not say where its CDP port is")
        return path

    def recover(self) -> None:
        """Replace a tab that timed out with a fresh one; end Chromium if that fails."""
        if not self.stale:
            return
        self.stale = False
        chromium, old = self.chromium, self.tab
        self.tab = None
        if chromium is None or not chromium.alive():
            self.end()
            return
        deadline = Deadline(_RECOVER_SECONDS)
        try:
            self.tab = Tab.open(chromium.connection, deadline, fresh=True)
            if old is not None:
                old.close(deadline)
        except (Expired, Gone, ProtocolError):
            self.end()

    def end(self) -> None:
        """End Chromium (if any); the next call starts a fresh one."""
        chromium, self.chromium, self.tab, self.stale = self.chromium, None, None, False
        if chromium is not None:
            chromium.end()

    def _answers(self) -> bool:
        """Whether Chromium is alive and answers (one round trip: a Chromium killed just
        before this call has not yet closed its pipe when ``alive`` looks)."""
        chromium = self.chromium
        if chromium is None or not chromium.alive():
            return False
        try:
            chromium.connection.call("Browser.getVersion", deadline=Deadline(5.0))
        except (Expired, Gone, ProtocolError):
            return False
        return True

    def _prepare(self, chromium: Chromium, deadline: Deadline) -> None:
        connection = chromium.connection
        connection.call("Browser.getVersion", deadline=deadline)
        downloads = f"{self.env.get('HOME') or chromium.profile}/Downloads"
        connection.call(
            "Browser.setDownloadBehavior",
            {"behavior": "allow", "downloadPath": downloads, "eventsEnabled": True},
            deadline=deadline,
        )
        connection.listen("", lambda method, params: self._on_browser_event(connection, params)
                          if method == "Target.targetCreated" else _cap_download(connection, params)
                          if method == "Browser.downloadProgress" else None)  # fmt: skip
        connection.call("Target.setDiscoverTargets", {"discover": True}, deadline=deadline)

    def _on_browser_event(self, connection: Connection, params: dict[str, Any]) -> None:
        """Close a page the session's tab opened (``target=_blank``, ``window.open``): only
        the tab is driven, and popups would pile up across calls. Pages a CDP client
        opens, and their popups, are the client's."""
        info = params.get("targetInfo") or {}
        tab = self.tab
        if info.get("type") == "page" and tab is not None and info.get("openerId") == tab.target_id:
            connection.send("Target.closeTarget", {"targetId": info.get("targetId")})

    def _failed(self, error: Exception) -> AgentError:
        chromium = self.chromium
        why = str(error)
        if chromium is not None:
            tail = chromium.stderr_tail().splitlines()[-3:]
            if isinstance(error, Gone) and tail:
                why += " (Chromium's last words: " + " | ".join(tail)[-600:] + ")"
        self.end()
        return AgentError("browser_failed", f"Chromium failed: {why}")


def _cap_download(connection: Connection, params: dict[str, Any]) -> None:
    """Cancel a download once it passes ``MAX_DOWNLOAD_BYTES`` (a page can start downloads
    with no action at all: five blobs of 20 MiB at load filled ``~/Downloads``). Chromium
    deletes a cancelled download's partial file. The sandbox's disk limit bounds the sum."""
    received = params.get("receivedBytes")
    total = params.get("totalBytes")
    too_big = any(isinstance(n, (int, float)) and n > MAX_DOWNLOAD_BYTES for n in (received, total))
    if params.get("state") == "inProgress" and too_big:
        connection.send("Browser.cancelDownload", {"guid": params.get("guid")})
