"""E2B's ``get_host(port)``, with the unmodified SDK, against a server with a preview
domain: the name it returns reaches a web server the sandbox runs, over HTTP and
WebSocket, with the sandbox's traffic token; ``allow_public_traffic`` lets anyone in."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websocket

from e2b import Sandbox
from ringfence.sandboxd.browser import AGENT_PORT, CDP_PORT
from tests.client.conftest import LiveServer, _serving
from tests.server.test_serve_process import Server

DOMAIN = "preview.localhost"
APP = Path(__file__).parents[1] / "server" / "port_app.py"
PORT = 8000
_VARIABLES = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DEBUG", "E2B_DOMAIN")


@pytest.fixture(scope="module")
def previewing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of its own with a preview domain, and the SDK's environment pointing at it."""
    saved = {name: os.environ.get(name) for name in _VARIABLES}
    server = Server(
        tmp_path_factory.mktemp("e2b-ports") / "data", None, env={"RINGFENCE_PORTS_DOMAIN": DOMAIN}
    )
    for live in _serving(server):
        os.environ.update(E2B_API_URL=live.url, E2B_SANDBOX_URL=live.url, E2B_API_KEY=live.key)
        os.environ.pop("E2B_DEBUG", None)
        os.environ.pop("E2B_DOMAIN", None)
        try:
            yield live
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _start_app(sbx: Sandbox) -> None:
    sbx.commands.run(
        f'python3 -c "$APP" {PORT} >/tmp/app.log 2>&1 &', envs={"APP": APP.read_text()}
    )


def _get(live: LiveServer, host: str, path: str, **headers: str) -> httpx.Response:
    """What a client resolving ``host`` to the server would get (the server's address with
    that Host header), waiting (bounded) while the sandbox's app starts."""
    deadline = time.monotonic() + 20
    while True:
        response = httpx.get(f"{live.url}{path}", headers={"Host": host, **headers}, timeout=10)
        if response.status_code != 502 or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def test_get_host_reaches_the_sandboxs_server_with_its_traffic_token(
    previewing: LiveServer,
) -> None:
    sbx = Sandbox.create()
    try:
        _start_app(sbx)
        host = sbx.get_host(PORT)
        assert host == f"{PORT}-{sbx.sandbox_id}.{DOMAIN}"
        token = sbx.traffic_access_token
        assert token
        refused = _get(previewing, host, "/echo")
        assert refused.status_code == 401
        got = _get(previewing, host, "/echo?from=e2b", **{"E2B-Traffic-Access-Token": token})
        assert got.status_code == 200, got.text
        assert got.json()["path"] == "/echo?from=e2b"
        assert token not in got.text  # the token never reaches the sandbox
        port = previewing.url.rsplit(":", 1)[1]
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{port}/ws", host=host, timeout=10,
            header=[f"E2B-Traffic-Access-Token: {token}"],
        )  # fmt: skip
        try:
            ws.send("through get_host")
            assert ws.recv() == "echo:through get_host"
        finally:
            ws.close()
    finally:
        sbx.kill()


def test_allow_public_traffic_lets_anyone_reach_its_ports(previewing: LiveServer) -> None:
    sbx = Sandbox.create(network={"allow_public_traffic": True})
    try:
        _start_app(sbx)
        got = _get(previewing, sbx.get_host(PORT), "/echo")
        assert got.status_code == 200, got.text
    finally:
        sbx.kill()


def test_another_tenants_key_cannot_reach_a_port(previewing: LiveServer) -> None:
    sbx = Sandbox.create()
    try:
        _start_app(sbx)
        host = sbx.get_host(PORT)
        other = _get(previewing, host, "/echo", **{"X-API-Key": previewing.other_key})
        assert other.status_code == 404
    finally:
        sbx.kill()


def test_the_browsers_ports_are_never_reached_by_get_host(previewing: LiveServer) -> None:
    """Even a server listening there (the sandbox's own, on the browser agent's and
    Chromium's DevTools ports) is refused: through them a caller would drive the sandbox's
    browser as Ringfence does."""
    sbx = Sandbox.create(network={"allow_public_traffic": True})
    try:
        for reserved in (AGENT_PORT, CDP_PORT):
            sbx.commands.run(
                f'python3 -c "$APP" {reserved} >/tmp/app.log 2>&1 &', envs={"APP": APP.read_text()}
            )
            host = sbx.get_host(reserved)
            token = sbx.traffic_access_token or ""
            for headers in ({}, {"E2B-Traffic-Access-Token": token}):
                refused = _get(previewing, host, "/echo", **headers)
                assert refused.status_code == 403, refused.text
                assert refused.json()["error"]["code"] == "forbidden"
    finally:
        sbx.kill()
