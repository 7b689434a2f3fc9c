"""The agent's command line: ``[--port N] [--chromium PATH] [--cdp-port N]``."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import threading
from collections.abc import Sequence
from types import FrameType

from . import AGENT_PORT, CDP_PORT
from ._server import AgentServer
from ._session import Session

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def default_chromium() -> str:
    """The first Chromium on ``$PATH`` (``/usr/bin/chromium`` if there is none: a call
    then answers ``unavailable`` naming it)."""
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="sandboxd.browser", description=__doc__)
    parser.add_argument("--port", type=int, default=AGENT_PORT, help="the agent's port")
    parser.add_argument("--chromium", default=None, help="Chromium's executable")
    parser.add_argument(
        "--cdp-port", type=int, default=CDP_PORT,
        help="Chromium's CDP port on 127.0.0.1 (0: any free one)",
    )  # fmt: skip
    args = parser.parse_args(list(argv))
    session = Session(args.chromium or default_chromium(), args.cdp_port, os.environ)
    server = AgentServer(args.port, session)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        with server.call_lock:
            session.end()
    return 0
