"""A sandbox Pod's daemon, reached as the control plane reaches it, without a cluster.

The exact commands of the Pod (the init container's copy of the daemon, then the sandbox
container's boot) run here as plain processes, with the Pod's daemon directory moved under
a temporary one; the control plane's relay carries the daemon client's requests to the
daemon's TCP port, as it does to a Pod's IP.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ringfence.backends.kubernetes._relay import Relay
from ringfence.backends.kubernetes.interactive import pod_ready
from ringfence.backends.kubernetes.manifests import DAEMON_MOUNT, pod_manifest
from ringfence.config import Config
from ringfence.errors import SandboxNotRunning
from ringfence.models import ResourceLimits
from ringfence.service.daemon_client import DaemonClient

from .conftest import assert_valid


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _local(command: list[str], root: Path) -> list[str]:
    python = command[0]
    assert python == "python3"
    return [sys.executable, *(arg.replace(DAEMON_MOUNT, str(root)) for arg in command[1:])]


def _wait_until_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert process.poll() is None, "the daemon exited at start"
            time.sleep(0.05)
    raise AssertionError("the daemon did not listen within 30 s")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[int]:
    """The Pod's daemon, listening on a free port of 127.0.0.1; yields the port."""
    port = _free_port()
    pod = pod_manifest("sb1", None, {}, ResourceLimits(), Config(kubernetes_daemon_port=port))
    assert_valid(pod)
    (init,) = pod["spec"]["initContainers"]
    (container,) = pod["spec"]["containers"]
    root = tmp_path / "daemon"
    subprocess.run(_local(init["command"], root), check=True, timeout=60)
    assert (root / "sandboxd" / "_main.py").exists()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    boot = _local(container["command"], root)
    env = {"PATH": os.environ["PATH"], "HOME": str(workspace)}
    process = subprocess.Popen(boot, cwd=workspace, env=env)
    try:
        _wait_until_ready(port, process)  # what the Pod's readiness probe does
        yield port
    finally:
        process.kill()
        process.wait()


@pytest.fixture
async def relay(tmp_path: Path, daemon: int) -> AsyncIterator[Relay]:
    relay = Relay(tmp_path / "relay.sock", "127.0.0.1", daemon)
    await relay.start()
    yield relay
    await relay.aclose()


async def test_the_control_plane_reaches_the_pods_daemon_through_the_relay(relay: Relay) -> None:
    client = DaemonClient("sb1", relay.path)
    try:
        await client.health(20)
        response = await client.send(
            "POST", "/process.Process/List",
            headers={"content-type": "application/json"}, content=b"{}",
        )  # fmt: skip
        body = await response.aread()
        assert response.status_code == 200
        assert json.loads(body) == {"processes": []}
    finally:
        await client.aclose()
    assert oct(relay.path.stat().st_mode & 0o777) == "0o600"  # only the control plane's user


async def test_a_daemon_that_is_gone_is_not_running(tmp_path: Path) -> None:
    relay = Relay(tmp_path / "gone.sock", "127.0.0.1", _free_port())
    await relay.start()
    client = DaemonClient("sb1", relay.path)
    try:
        with pytest.raises(SandboxNotRunning):
            await client.health(1)
    finally:
        await client.aclose()
        await relay.aclose()
    assert not relay.path.exists()


def test_readiness_needs_the_probe_and_an_address() -> None:
    ready = {"type": "Ready", "status": "True"}
    assert pod_ready({"status": {"conditions": [ready], "podIP": "10.0.0.5"}})
    assert not pod_ready({"status": {"conditions": [ready]}})
    assert not pod_ready({"status": {"conditions": [{**ready, "status": "False"}],
                                     "podIP": "10.0.0.5"}})  # fmt: skip
    assert not pod_ready({})


async def test_relay_pipes_both_ways_until_either_side_ends(tmp_path: Path) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((await reader.read()).upper())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    relay = Relay(tmp_path / "echo.sock", "127.0.0.1", port)
    await relay.start()
    try:
        reader, writer = await asyncio.open_unix_connection(str(relay.path))
        writer.write(b"x" * 300_000)
        writer.write_eof()
        assert await reader.read() == b"X" * 300_000
        writer.close()
    finally:
        await relay.aclose()
        server.close()
