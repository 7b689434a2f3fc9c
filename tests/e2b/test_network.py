"""E2B's network options through the unmodified SDK, on a real ``ringfence serve``: what
``allow_internet_access``, ``network`` and ``update_network`` ask for is what the sandbox can
reach, under the operator's floor, and what a key may not open is a 400 naming it.

The destinations are an HTTP origin on port 80 of a loopback address of this machine (E2B's
options open ports 80 and 443), which the server resolves under test names
(``RINGFENCE_NETWORK_HOSTS``) and lets API clients name (``RINGFENCE_NETWORK_INTERNAL_CIDRS``):
nothing leaves the machine. The operator's default for tenant ``default`` (the admin key's)
allows ``allowed.test`` and denies ``denied.test``; tenant ``globex`` (``other_key``) has none.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from e2b import ALL_TRAFFIC, Sandbox, SandboxException
from tests.client.conftest import LiveServer
from tests.server.test_serve_process import Server

_VARIABLES = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DEBUG", "E2B_DOMAIN")
NAMES = ("allowed.test", "other.test", "denied.test", "secret.test")
HELLO = "hello from origin"
# Prints the body, or "refused: <why>" (exit 0: E2B's commands.run raises on any other).
FETCH = """\
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode(), end="")
except Exception as exc:
    print("refused:", exc)
"""
# A direct connection, around the proxy.
DIRECT = """\
import socket, sys
try:
    socket.create_connection((sys.argv[1], 80), timeout=5)
    print("connected")
except OSError as exc:
    print("refused:", exc)
"""


class Origin(ThreadingHTTPServer):
    """Answers every GET with HELLO and keeps the heads it received."""

    daemon_threads = True

    def __init__(self, address: str) -> None:
        self.heads: list[str] = []
        super().__init__((address, 80), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Origin

    def do_GET(self) -> None:
        self.server.heads.append(f"{self.requestline}\r\n{self.headers}")
        body = HELLO.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    """On port 80 of a loopback address of its own (another test's origin may hold
    127.0.0.1:80)."""
    address = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
    served = Origin(address)
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.shutdown()
        served.server_close()


@pytest.fixture(scope="module")
def net_server(origin: Origin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    address = origin.server_address[0]
    assert isinstance(address, str)
    cidr = f"{address}/32"
    default = {"rules": [
        {"domain": "allowed.test", "cidr": cidr, "ports": [80]},
        {"domain": "denied.test", "action": "deny", "ports": [80]},
        # An internal range API clients may not name (not in INTERNAL_CIDRS): the operator's.
        {"domain": "mirror.test", "cidr": "10.77.0.0/16", "ports": [80]},
    ]}  # fmt: skip
    env = {
        "RINGFENCE_NETWORK_HOSTS": json.dumps({name: [address] for name in NAMES}),
        "RINGFENCE_NETWORK_INTERNAL_CIDRS": json.dumps([cidr]),
        "RINGFENCE_NETWORK_DEFAULTS": json.dumps({"default": default}),
    }
    server = Server(tmp_path_factory.mktemp("e2b-net") / "data", None, env)
    server.start()
    saved = {name: os.environ.get(name) for name in _VARIABLES}
    try:
        key = (server.data_dir / "admin-key").read_text().strip()
        bare = LiveServer(server.url, key, "", server.data_dir)
        live = LiveServer(server.url, key, bare.mint_key("agent", "globex"), server.data_dir)
        os.environ.update(E2B_API_URL=live.url, E2B_SANDBOX_URL=live.url, E2B_API_KEY=live.key)
        os.environ.pop("E2B_DEBUG", None)
        os.environ.pop("E2B_DOMAIN", None)
        yield live
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()


def fetch(sbx: Sandbox, name: str) -> str:
    """What a request to ``http://name/`` from inside the sandbox gets."""
    return sbx.commands.run(f"python3 -c '{FETCH}' http://{name}/").stdout


def reaches(sbx: Sandbox, name: str) -> bool:
    got = fetch(sbx, name)
    assert got == HELLO or ("403" in got and "egress denied by Ringfence" in got), got
    return got == HELLO


def test_without_options_a_sandbox_gets_its_tenants_default(net_server: LiveServer) -> None:
    with Sandbox.create() as sbx:
        assert reaches(sbx, "allowed.test")
        assert not reaches(sbx, "other.test")
    with Sandbox.create(api_key=net_server.other_key) as bare:  # globex: no default
        assert "refused" in fetch(bare, "allowed.test")
        with pytest.raises(SandboxException, match="created without network") as caught:
            bare.update_network({"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]})
        assert getattr(caught.value, "status_code", None) == 400


def test_allow_out_opens_only_what_it_lists(net_server: LiveServer, origin: Origin) -> None:
    with Sandbox.create(network={"allow_out": ["other.test"], "deny_out": [ALL_TRAFFIC]}) as sbx:
        assert reaches(sbx, "other.test")
        assert not reaches(sbx, "allowed.test"), "the default's allow rules are not added"
        seen = len(origin.heads)
        # Around the proxy: the origin's address is the sandbox's own loopback, any other
        # has no route.
        for address, why in ((origin.server_address[0], "refused"), ("203.0.113.7", "unreachable")):
            direct = sbx.commands.run(f"python3 -c '{DIRECT}' {address}").stdout
            assert direct.startswith("refused:") and why in direct, direct
        assert len(origin.heads) == seen


def test_internet_access_is_the_operators_default_or_a_400(net_server: LiveServer) -> None:
    """The default's rules come back as the operator's: its internal range, which the key
    could not name itself, passes for this tenant (and a native read-and-resend too)."""
    with Sandbox.create(allow_internet_access=True) as sbx:
        assert reaches(sbx, "allowed.test")
        assert not reaches(sbx, "other.test")
        url = f"{net_server.url}/v1/sandboxes/{sbx.sandbox_id}/network"
        auth = {"Authorization": f"Bearer {net_server.key}"}
        shown = httpx.get(url, headers=auth).json()
        assert ("mirror.test", "10.77.0.0/16") in [(r["domain"], r["cidr"]) for r in shown["rules"]]
        assert httpx.put(url, json=shown, headers=auth).status_code == 200
        own = {"rules": [{"domain": "mirror.test", "cidr": "10.77.0.0/24", "ports": [80]}]}
        refused = httpx.put(url, json=own, headers=auth)
        assert refused.status_code == 400 and "internal network" in refused.text
    with Sandbox.create(allow_internet_access=False) as closed:
        assert not reaches(closed, "allowed.test")
    with pytest.raises(SandboxException, match="allow_internet_access: this server defines"):
        Sandbox.create(allow_internet_access=True, api_key=net_server.other_key)


def test_update_network_changes_a_live_sandbox(net_server: LiveServer) -> None:
    with Sandbox.create(allow_internet_access=False) as sbx:
        assert not reaches(sbx, "other.test")
        sbx.update_network({"allow_out": ["other.test"], "deny_out": [ALL_TRAFFIC]})
        assert reaches(sbx, "other.test")
        assert not reaches(sbx, "allowed.test")
        sbx.update_network({"allow_internet_access": False})
        assert not reaches(sbx, "other.test")
        Sandbox.update_network(sbx.sandbox_id, {})  # E2B: every omitted field cleared
        assert reaches(sbx, "allowed.test"), "the default again"
        assert not reaches(sbx, "other.test")


def test_an_operator_deny_rule_outlives_allow_out(net_server: LiveServer) -> None:
    asked = {"allow_out": ["denied.test", "other.test"], "deny_out": [ALL_TRAFFIC]}
    with Sandbox.create(network=asked) as sbx:
        assert not reaches(sbx, "denied.test")
        assert reaches(sbx, "other.test")
        sbx.update_network({"allow_out": ["denied.test"]})
        assert not reaches(sbx, "denied.test")


def test_a_grant_beyond_the_ceiling_is_a_400_naming_it(net_server: LiveServer) -> None:
    for entry in ("169.254.169.254", "10.1.2.0/24", "*.test"):
        asked = {"allow_out": ["other.test", entry], "deny_out": [ALL_TRAFFIC]}
        with pytest.raises(SandboxException, match=r"network\.allowOut\[1\]") as caught:
            Sandbox.create(network=asked)
        assert entry in str(caught.value) and caught.value.status_code == 400  # type: ignore[attr-defined]
    with Sandbox.create(allow_internet_access=False) as sbx:
        with pytest.raises(SandboxException, match=r"allowOut\[0\].*internal network"):
            sbx.update_network({"allow_out": ["169.254.169.254"]})
        with pytest.raises(SandboxException, match=r"denyOut\[0\].*not names"):
            sbx.update_network({"deny_out": ["evil.test"]})
        assert not reaches(sbx, "allowed.test"), "a refused update changes nothing"


def test_a_header_transform_reaches_the_origin_only(net_server: LiveServer, origin: Origin) -> None:
    secret = "e2b-transform-" + "c0ffee" * 4
    asked = {
        "allow_out": ["secret.test"],
        "deny_out": [ALL_TRAFFIC],
        "rules": {"secret.test": [{"transform": {"headers": {"X-Api-Key": secret}}}]},
    }
    with Sandbox.create(network=asked) as sbx:
        before = len(origin.heads)
        assert reaches(sbx, "secret.test")
        assert secret in origin.heads[before], "the proxy set the rule's header"
        assert secret not in sbx.commands.run("env; cat /proc/*/cmdline 2>/dev/null").stdout
        shown = httpx.get(
            f"{net_server.url}/v1/sandboxes/{sbx.sandbox_id}/network",
            headers={"Authorization": f"Bearer {net_server.key}"},
        )
        assert shown.status_code == 200 and secret not in shown.text
        assert "<redacted>" in shown.text


JS_SCENARIO = Path(__file__).parents[1] / "js" / "e2b_network.mjs"


def test_js_sdk_network_scenario(net_server: LiveServer, origin: Origin) -> None:
    node = shutil.which("node")
    assert node, "the machine's node is required (scripts/setup installs it)"
    secret = "e2b-js-transform-" + "5eed" * 6
    before = len(origin.heads)
    done = subprocess.run(
        [node, str(JS_SCENARIO)],
        cwd=JS_SCENARIO.parent,
        env={**os.environ, "SECRET": secret},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "created": [True, False],
        "transformed": True,
        "updated": [False, True, False],  # denied.test: the operator's deny rule stays
        "closed": False,
        "beyondCeiling": "SandboxError:allowOut[0]",
        "nameDenied": "SandboxError:denyOut[0]",
        "stillClosed": False,
        "killed": True,
        "createBeyondCeiling": "SandboxError:network.allowOut[0]",
        "internet": [True, False],
    }
    assert any(secret in head for head in origin.heads[before:]), "the proxy set the header"
