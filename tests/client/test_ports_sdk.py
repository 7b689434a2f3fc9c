"""Preview URLs from the native SDK (``sbx.get_url``) and the CLI (``sandbox url``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from ringfence.client import Sandbox
from ringfence.errors import InvalidRequest
from tests.client.conftest import LiveServer
from tests.client.test_sandbox_cli import _cli

APP = Path(__file__).parents[1] / "server" / "port_app.py"
PORT = 8000


def _get(url: str, **headers: str) -> httpx.Response:
    """GET ``url``, waiting (bounded) while the sandbox's app starts listening."""
    deadline = time.monotonic() + 20
    while True:
        response = httpx.get(url, headers=headers, timeout=10)
        if response.status_code != 502 or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def test_get_url_reaches_the_sandboxs_server_with_the_sdks_key(live: LiveServer) -> None:
    with Sandbox.create(url=live.url, api_key=live.key) as sbx:
        sbx.commands.run(
            f'python3 -c "$APP" {PORT} >/tmp/app.log 2>&1 &', envs={"APP": APP.read_text()}
        )
        url = sbx.get_url(PORT)
        assert url == f"{live.url}/v1/sandboxes/{sbx.id}/ports/{PORT}/"
        assert _get(url + "echo").status_code == 401  # not public: a key is needed
        got = _get(url + "echo?q=1", Authorization=f"Bearer {live.key}")
        assert got.status_code == 200, got.text
        assert got.json()["path"] == "/echo?q=1"
        printed = _cli(live, "sandbox", "url", sbx.id, str(PORT))
        assert (printed.returncode, printed.stdout.decode().strip()) == (0, url)
        with pytest.raises(InvalidRequest):
            sbx.get_url(0)
        assert _cli(live, "sandbox", "url", sbx.id, "70000").returncode == 2


def test_a_sandbox_created_with_public_traffic_answers_anyone(live: LiveServer) -> None:
    created = _cli(live, "sandbox", "create", "--public-traffic", "--json")
    assert created.returncode == 0, created.stderr
    info = json.loads(created.stdout)
    assert info["public_traffic"] is True
    sbx = Sandbox.connect(info["id"], url=live.url, api_key=live.key)
    try:
        sbx.commands.run(
            f'python3 -c "$APP" {PORT} >/tmp/app.log 2>&1 &', envs={"APP": APP.read_text()}
        )
        assert _get(sbx.get_url(PORT) + "echo").status_code == 200
    finally:
        sbx.kill()
        sbx.close()


def test_sandboxes_created_in_one_group_reach_each_others_ports(live: LiveServer) -> None:
    created = _cli(live, "sandbox", "create", "--group", "build", "--json")
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["group"] == "build"
    peer = Sandbox.connect(json.loads(created.stdout)["id"], url=live.url, api_key=live.key)
    with Sandbox.create(group="build", url=live.url, api_key=live.key) as sbx:
        try:
            peer.commands.run(
                f'python3 -c "$APP" {PORT} >/tmp/app.log 2>&1 &', envs={"APP": APP.read_text()}
            )
            assert _get(peer.get_url(PORT) + "echo", Authorization=f"Bearer {live.key}").is_success
            fetch = (
                "import os, urllib.request as u; "
                "proxy = {'http': os.environ['RINGFENCE_GROUP_PROXY']}; "
                "o = u.build_opener(u.ProxyHandler(proxy)); "
                f"print(o.open('http://{peer.id}:{PORT}/echo').status)"
            )
            assert sbx.commands.run(["python3", "-c", fetch]).stdout.strip() == "200"
        finally:
            peer.kill()
            peer.close()
