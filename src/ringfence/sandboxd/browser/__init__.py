"""The browser agent: drives a headless Chromium inside a sandbox (docs/browser.md).

It is not the daemon and never runs in the daemon's process; it is shipped with it (this
package is bound read-only at ``/run/ringfence/sandboxd/browser``) and started by the
control plane through the daemon like any command, as the sandbox's user, under the
sandbox's limits. Standard library only, except the Markdown converter (PyPI's
``html-to-markdown``, installed by the ``browser`` template recipe), imported only when a
call asks for Markdown: a template without it answers that call with an error naming it.

Starting it
    ``python3 -I -B -c "import sys; sys.path.insert(0, '/run/ringfence'); \\
    import sandboxd.browser.__main__" [--port AGENT_PORT] [--chromium PATH] [--cdp-port N]``

    (``-I`` without ``-S``: the template's site-packages hold the converter.) It listens on
    ``127.0.0.1:AGENT_PORT`` inside the sandbox, so the control plane reaches it through
    the daemon's port tunnel (``sandboxd/_tunnel.py``); the port routes refuse
    ``AGENT_PORT`` and ``CDP_PORT`` to outside callers (they would drive the browser as
    the sandbox). It starts Chromium on its first call that needs it (or ``POST /start``):
    ``--headless --no-sandbox`` (Chromium's own sandbox cannot start under Ringfence's
    layers, which are the boundary), ``--remote-debugging-pipe`` for itself and
    ``--remote-debugging-port=CDP_PORT`` on 127.0.0.1 for CDP clients relayed by the
    server, the sandbox's egress proxy (``$HTTPS_PROXY``) as ``--proxy-server``, a
    profile under ``/tmp``, downloads into ``~/Downloads``. ``--chromium`` defaults to the
    first ``chromium`` on ``$PATH``; ``--cdp-port 0`` lets Chromium pick a free port.

    The benchmark's floor is this same agent on the host, outside any sandbox:
    ``python -m ringfence.sandboxd.browser --port N --cdp-port 0 --chromium
    /usr/bin/chromium`` (or the ``-c`` form above with the host's ``src/ringfence``), spoken
    to over the same wire protocol.

Inside
    ``_cdp`` (the CDP client over the pipe), ``_chromium`` (flags and the process group),
    ``_tab`` (one page target and what its main frame did), ``_scrape`` (the engine),
    ``_session`` (one Chromium and one tab across calls, recovery), ``_request`` (the
    body's checks, by hand: no pydantic here), ``_server`` (HTTP), ``_scripts`` (the page
    scripts, run in an isolated world), ``_firewall`` and ``_markdown`` (docs/design.md
    15.2). Every wait is bounded by the call's ``timeout``.

Wire protocol (HTTP/1.1, JSON bodies, one call at a time: later ones wait their turn)
    ``GET /health``: 200 with ``ringfence.models.browser.BrowserStatus``'s JSON.
    ``POST /start``: starts Chromium if it is not running; 200 with the status.
    ``POST /scrape``: body ``ScrapeRequest``'s JSON; 200 with ``ScrapeResult``'s JSON
    (``sandbox_id`` unset: the server fills it).
    ``POST /close``: ends Chromium (the agent stays); 200 with the status.
    ``GET /cdp``: 200 ``{"path": "/devtools/browser/<id>"}``, the browser target's
    WebSocket path on ``CDP_PORT`` (Chromium started first if needed).
    A request a web page made (an ``Origin`` or ``Sec-Fetch-*`` header, a ``Host`` that is
    not loopback, a body that is not ``application/json``) is refused: pages the browser
    renders can reach this port too.
    An error is ``{"error": {"code": CODE, "message": TEXT}}`` with the status below; a
    message names what failed (the selector, the action's index and type, the URL):

    ==================  ======  ==============================================
    code                status  when
    ==================  ======  ==============================================
    invalid_request     400     the body is not a valid request
    action_failed       422     an action could not be done (no such element)
    timeout             504     the call's ``timeout`` passed
    unavailable         503     Chromium or the converter is not installed
    browser_failed      502     Chromium died or broke the protocol
    ==================  ======  ==============================================

    A page that does not load (DNS, refused by the egress policy, HTTP errors) is not an
    error of the call: the result's ``metadata.error`` and ``status_code`` say so.
"""

from __future__ import annotations

__all__ = ["AGENT_PORT", "CDP_PORT"]

AGENT_PORT = 49990
CDP_PORT = 49991
