"""Egress policies through the SDK, against a real ``ringfence serve``: a sandbox (or a
one-shot execution) created with a policy reaches the test origin under an allowed name and
not under others, and ``set_network`` changes that while it runs.

The origin is ``tests/network``'s: a server on this machine's loopback that the server under
test resolves under test names (``RINGFENCE_NETWORK_HOSTS``); nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from ringfence.client import AsyncRingfence, AsyncSandbox, Sandbox, SandboxNotFound
from ringfence.client._base import Settings
from ringfence.client._link import Link, http_client
from ringfence.errors import InvalidRequest
from ringfence.models import NetworkPolicy, Status
from tests.client.conftest import LiveServer
from tests.network.conftest import TEST_NAMES, Origin, http_origin
from tests.server.test_serve_process import Server

__all__ = ["fetch", "http_origin", "net_live", "policy"]

# Prints the body, or "refused: <why>" and exits 3: what a tool in the sandbox would show.
FETCH = """\
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode(), end="")
except Exception as exc:
    print("refused:", exc)
    sys.exit(3)
"""
HELLO = "hello from origin\n"
# Nothing listens here: a request that reached the network would fail differently.
NOWHERE = "http://127.0.0.1:9"


@pytest.fixture(scope="session")
def net_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``ringfence serve`` (SQLite) whose proxy resolves the test names to this machine's
    loopback, and which lets tenants name 127.0.0.1/32 in rules (an operator's choice)."""
    env = {  # the server process's only
        "RINGFENCE_NETWORK_HOSTS": _hosts(),
        "RINGFENCE_NETWORK_INTERNAL_CIDRS": '["127.0.0.1/32"]',
    }
    server = Server(tmp_path_factory.mktemp("net-live") / "data", None, env)
    server.start()
    try:
        key = (server.data_dir / "admin-key").read_text().strip()
        live = LiveServer(server.url, key, "", server.data_dir)
        yield LiveServer(server.url, key, live.mint_key("agent", "globex"), server.data_dir)
    finally:
        server.stop()


def _hosts() -> str:
    return json.dumps({name: ["127.0.0.1"] for name in TEST_NAMES})


def policy(port: int, *names: str, **extra: Any) -> dict[str, Any]:
    """Allow ``names`` (default allowed.test) on the origin's port; deny denied.test."""
    rules: list[dict[str, Any]] = [
        {"domain": name, "cidr": "127.0.0.1/32", "ports": [port], **extra}
        for name in names or ("allowed.test",)
    ]
    rules.append({"domain": "denied.test", "action": "deny", "ports": [port]})
    return {"rules": rules}


async def fetch(sbx: AsyncSandbox, url: str) -> str:
    """What a request to ``url`` from inside the sandbox gets."""
    result = await sbx.commands.run(["python3", "-c", FETCH, url])
    assert result.exit_code in (0, 3), result.stderr
    return result.stdout


async def test_a_sandbox_created_with_a_policy_reaches_only_what_it_allows(
    net_live: LiveServer, http_origin: Origin
) -> None:
    port = http_origin.port
    async with await AsyncSandbox.create(
        url=net_live.url, api_key=net_live.key, network=policy(port)
    ) as sbx:
        assert await fetch(sbx, f"http://allowed.test:{port}/") == HELLO
        for name in ("other.test", "denied.test"):  # no rule; a deny rule
            refused = await fetch(sbx, f"http://{name}:{port}/")
            assert "403" in refused and "egress denied by Ringfence" in refused
        assert http_origin.connections == 1, "refused requests never reach the origin"
        assert await sbx.get_network() == NetworkPolicy.model_validate(policy(port))
        assert (await sbx.info()).network.mode == "rules"


async def test_set_network_changes_a_live_sandbox(
    net_live: LiveServer, http_origin: Origin
) -> None:
    port = http_origin.port
    async with await AsyncSandbox.create(
        url=net_live.url, api_key=net_live.key, network=policy(port)
    ) as sbx:
        assert await fetch(sbx, f"http://allowed.test:{port}/") == HELLO
        changed = await sbx.set_network(policy(port, "other.test"))
        assert [r.domain for r in changed.rules] == ["other.test", "denied.test"]
        assert "403" in await fetch(sbx, f"http://allowed.test:{port}/")
        assert await fetch(sbx, f"http://other.test:{port}/") == HELLO
        assert await sbx.get_network() == changed

        closed = await sbx.set_network(NetworkPolicy(mode="rules", rules=[]))
        assert closed.rules == []
        assert "403" in await fetch(sbx, f"http://other.test:{port}/")
        assert http_origin.connections == 2


async def test_the_blocking_sandbox_takes_and_changes_a_policy_with_a_secret_header(
    net_live: LiveServer, http_origin: Origin
) -> None:
    port, secret = http_origin.port, "sdk-secret-" + "5eed" * 6

    def scenario() -> tuple[str, NetworkPolicy, NetworkPolicy]:
        with Sandbox.create(
            url=net_live.url, api_key=net_live.key,
            network=NetworkPolicy.model_validate(policy(port, "other.test")),
        ) as sbx:  # fmt: skip
            before = sbx.commands.run(["python3", "-c", FETCH, f"http://allowed.test:{port}/"])
            assert "403" in before.stdout
            shown = sbx.set_network(policy(port, headers={"X-Api-Key": secret}))
            after = sbx.commands.run(["python3", "-c", FETCH, f"http://allowed.test:{port}/"])
            env = sbx.commands.run(["env"]).stdout
            assert secret not in env
            return after.stdout, shown, sbx.get_network()

    body, shown, read = await asyncio.to_thread(scenario)
    assert body == HELLO
    assert secret in http_origin.heads[0].decode(), "the proxy added the rule's header"
    assert shown == read and shown.rules[0].headers == {"X-Api-Key": "<redacted>"}


async def test_one_shot_executions_take_a_policy(net_live: LiveServer, http_origin: Origin) -> None:
    port = http_origin.port
    command = ["python3", "-c", FETCH, f"http://allowed.test:{port}/"]
    async with AsyncRingfence(net_live.url, net_live.key) as rf:
        allowed = await rf.executions.run(command, network=policy(port), timeout=60)
        assert (allowed.status, allowed.logs) == (Status.SUCCEEDED, HELLO)
        other = await rf.executions.run(command, network=policy(port, "other.test"), timeout=60)
        assert other.exit_code == 3 and "403" in other.logs
        none = await rf.executions.run(command, timeout=60)  # no policy: no network at all
        assert none.exit_code == 3 and "refused" in none.logs
    assert http_origin.connections == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"rules": [{"domain": "*"}]},
        {"rules": [{"domain": "*.com"}]},
        {"rules": [{"domain": "pypi.org", "ports": [0]}]},
        {"rules": [{"domain": "pypi.org", "action": "deny", "headers": {"X": "y"}}]},
        {"mode": "none", "rules": [{"domain": "pypi.org"}]},
        {"rules": [{"domain": "pypi.org"}], "typo": 1},
        ["pypi.org"],
    ],
)
async def test_bad_policies_are_refused_before_anything_is_sent(bad: Any) -> None:
    with pytest.raises(InvalidRequest) as exc:
        await AsyncSandbox.create(url=NOWHERE, api_key="k", network=bad)
    assert exc.value.code == "invalid_request" and "network" in exc.value.message
    async with AsyncRingfence(NOWHERE, "k") as rf:
        with pytest.raises(InvalidRequest):
            await rf.executions.run(["true"], network=bad)


async def test_the_server_refuses_what_the_sdk_cannot_know(
    net_live: LiveServer, http_origin: Origin
) -> None:
    internal = {"rules": [{"domain": "db.example.com", "cidr": "10.0.0.0/8"}]}
    with pytest.raises(InvalidRequest) as exc:  # an internal network the operator did not list
        await AsyncSandbox.create(url=net_live.url, api_key=net_live.key, network=internal)
    assert "10.0.0.0/8" in exc.value.message
    async with await AsyncSandbox.create(url=net_live.url, api_key=net_live.key) as plain:
        assert (await plain.get_network()).mode == "none"
        with pytest.raises(InvalidRequest):  # created without network: nothing to decide
            await plain.set_network(policy(http_origin.port))
    async with await AsyncSandbox.create(
        url=net_live.url, api_key=net_live.key, network=policy(http_origin.port)
    ) as sbx:
        with pytest.raises(InvalidRequest):
            await sbx.set_network(internal)
        with pytest.raises(InvalidRequest):
            await sbx.set_network({"rules": [{"domain": "*"}]})
        with pytest.raises(SandboxNotFound):
            await AsyncSandbox.connect(sbx.id, url=net_live.url, api_key=net_live.other_key)
        settings = Settings(net_live.url, net_live.other_key, 30.0)
        stranger = AsyncSandbox(await sbx.info(), Link(settings, sbx.id, http_client(settings)))
        with pytest.raises(SandboxNotFound):
            await stranger.get_network()
        with pytest.raises(SandboxNotFound):
            await stranger.set_network({"rules": []})
        await stranger.aclose()
        assert await sbx.get_network() == NetworkPolicy.model_validate(policy(http_origin.port))
