"""The egress options of ``ringfence sandbox`` and ``ringfence exec``, as a user runs them:
against the real server of ``test_network_sdk`` (sandboxes) and on this machine (``exec``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from ringfence.models import NetworkPolicy
from tests.client.conftest import LiveServer
from tests.client.test_network_sdk import FETCH, HELLO, http_origin, net_live, policy
from tests.network.conftest import TEST_NAMES, Origin
from tests.server.test_serve_process import RINGFENCE

__all__ = ["http_origin", "net_live"]


async def _cli(
    *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """The CLI in a thread: the test's origin is served by this event loop meanwhile."""
    return await asyncio.to_thread(
        subprocess.run, [RINGFENCE, *args], env={**os.environ, **(env or {})}, input=stdin,
        capture_output=True, timeout=120,
    )  # fmt: skip


def _api(live: LiveServer) -> dict[str, str]:
    return {"RINGFENCE_URL": live.url, "RINGFENCE_API_KEY": live.key}


def _fetch_args(sid: str, url: str) -> tuple[str, ...]:
    return ("sandbox", "exec", sid, "--", "python3", "-c", FETCH, url)


async def test_create_with_a_policy_file_then_read_and_replace_it(
    net_live: LiveServer, http_origin: Origin, tmp_path: Path
) -> None:
    port, env = http_origin.port, _api(net_live)
    (tmp_path / "policy.json").write_text(json.dumps(policy(port)))
    created = await _cli("sandbox", "create", "--network", str(tmp_path / "policy.json"), env=env)
    assert created.returncode == 0, created.stderr
    sid = created.stdout.decode().strip()
    try:
        allowed = await _cli(*_fetch_args(sid, f"http://allowed.test:{port}/"), env=env)
        assert (allowed.returncode, allowed.stdout.decode()) == (0, HELLO)
        other = await _cli(*_fetch_args(sid, f"http://other.test:{port}/"), env=env)
        assert other.returncode == 3 and b"403" in other.stdout

        shown = await _cli("sandbox", "network", sid, env=env)
        expected = NetworkPolicy.model_validate(policy(port)).model_dump(mode="json")
        assert shown.returncode == 0 and json.loads(shown.stdout) == expected

        new = json.dumps(policy(port, "other.test")).encode()
        replaced = await _cli("sandbox", "network", sid, "--set", "-", env=env, stdin=new)
        assert replaced.returncode == 0, replaced.stderr
        assert json.loads(replaced.stdout)["rules"][0]["domain"] == "other.test"
        now_other = await _cli(*_fetch_args(sid, f"http://other.test:{port}/"), env=env)
        assert now_other.stdout.decode() == HELLO
        now_allowed = await _cli(*_fetch_args(sid, f"http://allowed.test:{port}/"), env=env)
        assert now_allowed.returncode == 3 and b"403" in now_allowed.stdout
    finally:
        await _cli("sandbox", "kill", sid, env=env)
    assert http_origin.connections == 2


async def test_allow_and_deny_domain_options_make_the_policy(net_live: LiveServer) -> None:
    created = await _cli(
        "sandbox", "create", "--json", "--allow-domain", "pypi.org",
        "--allow-domain", "*.pythonhosted.org:443,8443", "--deny-domain", "evil.pypi.org",
        env=_api(net_live),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    record = json.loads(created.stdout)
    await _cli("sandbox", "kill", record["id"], env=_api(net_live))
    assert record["network"] == {
        "mode": "rules",
        "rules": [
            {"action": "allow", "domain": "pypi.org", "cidr": None, "ports": [80, 443],
             "headers": {}},
            {"action": "allow", "domain": "*.pythonhosted.org", "cidr": None,
             "ports": [443, 8443], "headers": {}},
            {"action": "deny", "domain": "evil.pypi.org", "cidr": None, "ports": [80, 443],
             "headers": {}},
        ],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--allow-domain", "*"), b"too broad"),
        (("--allow-domain", "*.com"), b"too broad"),
        (("--allow-domain", "pypi.org:https"), b"ports are numbers"),
        (("--allow-domain", "pypi.org:70000"), b"less than or equal to 65535"),
        (("--deny-domain", "bad domain"), b"invalid domain"),
        (("--network", "/nonexistent.json"), b"No such file"),
        (("--network", "-", "--allow-domain", "pypi.org"), b"whole policy"),
    ],
)
async def test_bad_network_options_exit_2_with_the_reason(
    net_live: LiveServer, args: tuple[str, ...], says: bytes
) -> None:
    for command in (("sandbox", "create"), ("exec",)):
        tail = ("--", "true") if command == ("exec",) else ()
        done = await _cli(*command, *args, *tail, env=_api(net_live), stdin=b"{}")
        assert done.returncode == 2 and says in done.stderr, (command, done.stderr)
        assert b"Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json", b"not JSON"),
        (b'["pypi.org"]', b"JSON object"),
        (b'{"rules": [{"domain": "pypi.org", "port": 443}]}', b"rules.0.port"),
        (b'{"mode": "none", "rules": [{"domain": "pypi.org"}]}', b"mode none takes no rules"),
    ],
)
async def test_bad_policy_files_exit_2_with_the_reason(
    net_live: LiveServer, http_origin: Origin, content: bytes, says: bytes
) -> None:
    env = _api(net_live)
    created = await _cli("sandbox", "create", "--network", "-", env=env, stdin=content)
    assert created.returncode == 2 and says in created.stderr, created.stderr
    good = json.dumps(policy(http_origin.port)).encode()
    sid = (await _cli("sandbox", "create", "--network", "-", env=env, stdin=good)).stdout
    sid_text = sid.decode().strip()
    try:
        refused = await _cli("sandbox", "network", sid_text, "--set", "-", env=env, stdin=content)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
        shown = json.loads((await _cli("sandbox", "network", sid_text, env=env)).stdout)
        assert shown["rules"][0]["domain"] == "allowed.test", "the policy is unchanged"
    finally:
        await _cli("sandbox", "kill", sid_text, env=env)


async def test_the_servers_refusals_exit_2_and_unknown_sandboxes_exit_1(
    net_live: LiveServer,
) -> None:
    env = _api(net_live)
    internal = b'{"rules": [{"domain": "db.example.com", "cidr": "10.0.0.0/8"}]}'
    created = await _cli("sandbox", "create", "--network", "-", env=env, stdin=internal)
    assert created.returncode == 2 and b"10.0.0.0/8" in created.stderr
    missing = await _cli("sandbox", "network", "sb-missing", env=env)
    assert missing.returncode == 1 and b"sb-missing" in missing.stderr
    plain = (await _cli("sandbox", "create", env=env)).stdout.decode().strip()
    try:
        given = await _cli(
            "sandbox", "network", plain, "--set", "-", env=env, stdin=b'{"rules": []}'
        )
        assert given.returncode == 2 and b"Traceback" not in given.stderr
    finally:
        await _cli("sandbox", "kill", plain, env=env)


async def test_exec_runs_a_one_shot_command_under_a_policy(
    http_origin: Origin, tmp_path: Path
) -> None:
    port = http_origin.port
    (tmp_path / "policy.json").write_text(json.dumps(policy(port)))
    hosts = {"RINGFENCE_NETWORK_HOSTS": json.dumps({n: ["127.0.0.1"] for n in TEST_NAMES})}
    both = (
        "import urllib.request\n"
        f"print(urllib.request.urlopen('http://allowed.test:{port}/').read().decode(), end='')\n"
        "try:\n"
        f"    urllib.request.urlopen('http://denied.test:{port}/')\n"
        "except Exception as exc:\n"
        "    print('refused:', exc)\n"
    )
    ran = await _cli(
        "exec", "--network", str(tmp_path / "policy.json"), "--", "python3", "-c", both, env=hosts
    )
    assert ran.returncode == 0, ran.stderr
    out = ran.stdout.decode()
    assert out.startswith(HELLO) and "refused: HTTP Error 403" in out
    bare = await _cli("exec", "--", "python3", "-c", FETCH, f"http://allowed.test:{port}/",
                      env=hosts)  # fmt: skip
    assert bare.returncode == 3, "without a policy: no network"
    assert http_origin.connections == 1
