"""``ringfence keys create|list|revoke|rotate`` on the host, against a running server: what
the operator changes in the store, the server (which remembers keys it read) obeys within
seconds. The secret is printed by create and rotate only, once."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringfence.service.keys import KEY_CACHE_SECONDS
from tests.server.test_serve_process import RINGFENCE, Server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server on SQLite in its data directory (the keys commands open the same)."""
    running = Server(tmp_path / "data", None)
    yield running
    if running.process is not None and running.process.poll() is None:
        running.kill()


def _keys(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RINGFENCE, "keys", *args, *server.args()], capture_output=True, text=True, timeout=60
    )


def _status(server: Server, key: str) -> int:
    return httpx.get(f"{server.url}/v1/whoami", headers={"X-API-Key": key}).status_code


def _until(server: Server, key: str, status: int) -> None:
    """Poll the server until it answers ``key`` with ``status`` (bounded)."""
    deadline = time.monotonic() + KEY_CACHE_SECONDS + 10
    while _status(server, key) != status:
        assert time.monotonic() < deadline, f"the server still answers {_status(server, key)}"
        time.sleep(0.05)


def test_the_operator_lists_rotates_and_revokes_keys_of_a_running_server(server: Server) -> None:
    server.start()
    created = _keys(server, "create", "--tenant", "acme", "--role", "approver", "--name", "Grace")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    key_id = key.split("_")[1]
    me = httpx.get(f"{server.url}/v1/whoami", headers={"X-API-Key": key}).json()
    assert (me["key_id"], me["name"]) == (key_id, "Grace"), "the server has read the key"

    listed = _keys(server, "list", "--tenant", "acme")
    assert listed.returncode == 0 and key_id in listed.stdout and "Grace" in listed.stdout
    as_json = json.loads(_keys(server, "list", "--json").stdout)
    assert {k["name"] for k in as_json} >= {"Grace", "admin"}
    everything = listed.stdout + _keys(server, "list", "--json").stdout
    assert key.split("_", 2)[2] not in everything, "no secret is ever listed"

    rotated = _keys(server, "rotate", key_id)
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.strip()
    assert new.startswith(f"rf_{key_id}_") and new != key
    _until(server, key, 401)
    assert _status(server, new) == 200

    revoked = _keys(server, "revoke", new)  # the whole key works as well as its id
    assert revoked.returncode == 0 and "revoked" in revoked.stderr and new not in revoked.stderr
    _until(server, new, 401)
    assert "revoked" in _keys(server, "list").stdout
    again = _keys(server, "rotate", key_id)
    assert again.returncode == 1 and "revoked" in again.stderr and "Traceback" not in again.stderr
    unknown = _keys(server, "revoke", "0" * 16)
    assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1
    bad = _keys(server, "create", "--tenant", "acme", "--name", "a\x07b")
    assert bad.returncode == 2 and "name" in bad.stderr
