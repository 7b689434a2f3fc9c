"""Acceptance of the agent's workstation (issue 17): the coding agent's scenario of
DESIGN.md end to end, on a real ``ringfence serve`` with real sandboxes.

A git repository served over HTTP on this machine's loopback, under a name only the
sandbox's egress policy allows, is cloned; its dependency installs from a package index
behind the same policy; its tests run; its web server starts on a port and is queried from
inside and from outside (both preview URL forms, E2B's ``get_host`` with the unmodified SDK
included) over HTTP and WebSocket; the agent's change is read back as a diff; a terminal
runs a full-screen program through a resize; a volume keeps a file across two sandboxes.

The origin (the repository and the index) is a plain HTTP server on the host's loopback,
known to the server's resolver under test names (``RINGFENCE_NETWORK_HOSTS``) and reachable
only because the operator lists loopback as an internal network the tenant may name
(``RINGFENCE_NETWORK_INTERNAL_CIDRS``): nothing leaves this machine."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from tests.client.conftest import LiveServer, _serving
from tests.server.test_serve_process import Server

from e2b import Sandbox as E2bSandbox
from ringfence.client import AsyncPtyHandle, AsyncRingfence, AsyncSandbox

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).parent / "agent_project"
GIT_HOST = "git.example.test"
INDEX_HOST = "pypi.example.test"
APP_PORT = 8000
DOMAIN = "preview.test"
WAIT = 30  # a bound on every wait below, never an expectation


def _wheel(target: Path) -> Path:
    """The project's one dependency, ``greet`` 1.0, as a wheel (a zip with metadata)."""
    path = target / "greet-1.0-py3-none-any.whl"
    files = {
        "greet/__init__.py": b'def hello(path):\n    return "hello " + path\n',
        "greet-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: greet\nVersion: 1.0\n",
        "greet-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("greet-1.0.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("greet-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _repository(site: Path) -> None:
    """A bare repository ``app.git`` with the project, served by dumb HTTP (static files)."""
    work = site.parent / "work"
    work.mkdir()
    shutil.copy(PROJECT / "app.py", work / "app.py")
    shutil.copy(PROJECT / "test_app.py.txt", work / "test_app.py")
    (work / "requirements.txt").write_text("greet==1.0\n")
    git = ["git", "-c", "user.name=dev", "-c", "user.email=dev@example.test"]
    subprocess.run([*git, "init", "-q", "-b", "main", str(work)], check=True)
    subprocess.run([*git, "-C", str(work), "add", "."], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "the app"], check=True)
    bare = site / "app.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True)


def _index(site: Path) -> None:
    """A package index (PEP 503's simple layout, static files) holding ``greet``."""
    files = site / "files"
    files.mkdir()
    wheel = _wheel(files)
    project = site / "simple" / "greet"
    project.mkdir(parents=True)
    (project / "index.html").write_text(
        f'<html><body><a href="/files/{wheel.name}">{wheel.name}</a></body></html>\n'
    )


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The port of the origin serving the repository and the index."""
    site = tmp_path_factory.mktemp("origin") / "site"
    site.mkdir()
    _repository(site)
    _index(site)
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def workstation(tmp_path_factory: pytest.TempPathFactory, origin: int) -> Iterator[LiveServer]:
    env = {
        "RINGFENCE_NETWORK_HOSTS": json.dumps({GIT_HOST: ["127.0.0.1"], INDEX_HOST: ["127.0.0.1"]}),
        "RINGFENCE_NETWORK_INTERNAL_CIDRS": json.dumps(["127.0.0.1/32"]),
        "RINGFENCE_PORTS_DOMAIN": DOMAIN,
    }
    yield from _serving(Server(tmp_path_factory.mktemp("workstation") / "data", None, env))


def _policy(origin: int) -> dict[str, object]:
    return {
        "rules": [
            {"domain": GIT_HOST, "cidr": "127.0.0.1/32", "ports": [origin]},
            {"domain": INDEX_HOST, "cidr": "127.0.0.1/32", "ports": [origin]},
        ]
    }


@pytest.fixture
async def agent(workstation: LiveServer, origin: int) -> AsyncIterator[AsyncSandbox]:
    async with await AsyncSandbox.create(
        url=workstation.url, api_key=workstation.key, network=_policy(origin), timeout=600
    ) as sandbox:
        yield sandbox


async def test_the_coding_agents_scenario(
    agent: AsyncSandbox, origin: int, workstation: LiveServer
) -> None:
    clone = await agent.commands.run(
        f"git clone -q http://{GIT_HOST}:{origin}/app.git /home/user/app 2>&1", timeout=120
    )
    assert clone.exit_code == 0, clone.stdout
    # Only what the policy names is reachable: another name is refused at the proxy.
    elsewhere = await agent.commands.run(
        "git clone -q http://example.org/app.git /tmp/other 2>&1", timeout=60
    )
    assert elsewhere.exit_code != 0 and "403" in elsewhere.stdout, elsewhere.stdout

    install = await agent.commands.run(
        f"python3 -m pip install -q --disable-pip-version-check "
        f"--index-url http://{INDEX_HOST}:{origin}/simple --trusted-host {INDEX_HOST} "
        "-r requirements.txt 2>&1",
        cwd="/home/user/app",
        timeout=120,
    )
    assert install.exit_code == 0, install.stdout
    tests = await agent.commands.run("python3 -m unittest -q 2>&1", cwd="/home/user/app")
    assert tests.exit_code == 0 and "OK" in tests.stdout, tests.stdout

    await agent.commands.run(
        f"python3 app.py {APP_PORT}", cwd="/home/user/app", background=True, timeout=None
    )
    inside = await agent.commands.run(
        f"for i in $(seq 100); do curl -sf http://127.0.0.1:{APP_PORT}/inside && exit; "
        "sleep 0.1; done; exit 1",
        timeout=30,
    )
    assert inside.stdout == "hello /inside\n", inside.stdout
    await _outside(agent, workstation)

    # The agent changes the app; the change reads back as git's diff.
    await agent.files.write(
        "/home/user/app/requirements.txt", "greet==1.0\n# pinned for the demo\n"
    )
    diff = await agent.commands.run("git diff --stat", cwd="/home/user/app")
    assert "requirements.txt | 1 +" in diff.stdout, diff.stdout


async def _outside(agent: AsyncSandbox, live: LiveServer) -> None:
    """The app's port from outside: the path form with the tenant's key, the host-name form,
    E2B's ``get_host`` with the sandbox's traffic token, and a WebSocket through each."""
    key = {"Authorization": f"Bearer {live.key}"}
    async with httpx.AsyncClient(timeout=WAIT) as http:
        by_path = await http.get(agent.get_url(APP_PORT) + "outside", headers=key)
        assert (by_path.status_code, by_path.text) == (200, "hello /outside\n"), by_path.text
        host = f"{APP_PORT}-{agent.id}.{DOMAIN}"
        by_host = await http.get(f"{live.url}/by-host", headers={**key, "Host": host})
        assert (by_host.status_code, by_host.text) == (200, "hello /by-host\n"), by_host.text
        nobody = await http.get(agent.get_url(APP_PORT))
        assert nobody.status_code == 401, "no credential, no port"

        e2b = await asyncio.to_thread(_e2b_connect, agent.id, live)
        assert e2b.get_host(APP_PORT) == host
        token = {"E2B-Traffic-Access-Token": e2b.traffic_access_token or ""}
        by_e2b = await http.get(
            f"{live.url}/e2b", headers={**token, "Host": e2b.get_host(APP_PORT)}
        )
        assert (by_e2b.status_code, by_e2b.text) == (200, "hello /e2b\n"), by_e2b.text

    port = int(live.url.rsplit(":", 1)[1])
    path = f"/v1/sandboxes/{agent.id}/ports/{APP_PORT}/ws"
    assert await _websocket_echo(port, path, "127.0.0.1", key, "via path") == "echo: via path"
    assert await _websocket_echo(port, "/ws", host, key, "via host") == "echo: via host"


def _e2b_connect(sandbox_id: str, live: LiveServer) -> E2bSandbox:
    """The sandbox, as E2B's unmodified SDK sees it (its API and sandbox traffic pointed at
    the server, as tests/e2b does)."""
    saved = {name: os.environ.get(name) for name in ("E2B_API_URL", "E2B_SANDBOX_URL")}
    os.environ.update(E2B_API_URL=live.url, E2B_SANDBOX_URL=live.url)
    try:
        return E2bSandbox.connect(sandbox_id, api_key=live.key)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def _websocket_echo(
    port: int, path: str, host: str, headers: dict[str, str], text: str
) -> str:
    """One text message's echo over a WebSocket to ``path`` (RFC 6455, by hand: the
    client sends masked frames, the app answers unmasked)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        nonce = base64.b64encode(os.urandom(16)).decode()
        head = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {nonce}\r\n"
            "Sec-WebSocket-Version: 13\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            + "\r\n"
        )
        writer.write(head.encode())
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert answer.startswith(b"HTTP/1.1 101"), answer
        accept = base64.b64encode(
            hashlib.sha1((nonce + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
        )
        fields = dict(line.split(b":", 1) for line in answer.split(b"\r\n")[1:] if b":" in line)
        assert {k.strip().lower(): v.strip() for k, v in fields.items()}.get(
            b"sec-websocket-accept"
        ) == accept, answer
        payload, mask = text.encode(), os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        writer.write(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
        frame = await asyncio.wait_for(reader.readexactly(2), WAIT)
        assert frame[0] == 0x81, frame
        return (await asyncio.wait_for(reader.readexactly(frame[1]), WAIT)).decode()
    finally:
        writer.close()


# A full-screen program (what vim does to a terminal, in a few lines): the alternate
# screen, raw mode, a redraw on every SIGWINCH, one line per key, 'q' to quit.
_FULL_SCREEN = r"""
import os, signal, tty
def draw(*_):  # os.write: a signal may come while another write is under way
    cols, rows = os.get_terminal_size(0)
    os.write(1, f"\x1b[2J\x1b[Hsize {rows}x{cols}\r\n".encode())
signal.signal(signal.SIGWINCH, draw)
tty.setraw(0)
os.write(1, b"\x1b[?1049h")
draw()
while (key := os.read(0, 1)) != b"q":
    os.write(1, b"key " + key + b"\r\n")
os.write(1, b"\x1b[?1049l")
"""


async def _until(terminal: AsyncPtyHandle, seen: bytearray, marker: bytes) -> None:
    """Read the terminal's output into ``seen`` until ``marker`` is in it (bounded)."""

    async def read() -> None:
        async for chunk in terminal:
            seen.extend(chunk)
            if marker in seen:
                return
        raise AssertionError(f"the terminal ended before {marker!r}: {bytes(seen)!r}")

    if marker not in seen:
        try:
            await asyncio.wait_for(read(), WAIT)
        except TimeoutError:
            raise AssertionError(f"no {marker!r} within {WAIT} s: {bytes(seen)!r}") from None


async def test_a_terminal_runs_a_full_screen_program_through_a_resize(
    agent: AsyncSandbox,
) -> None:
    terminal = await agent.pty.create(24, 80, cmd=["python3", "-c", _FULL_SCREEN])
    seen = bytearray()
    await _until(terminal, seen, b"size 24x80")
    assert b"\x1b[?1049h" in seen, "the alternate screen"
    await terminal.resize(40, 120)
    await _until(terminal, seen, b"size 40x120")
    await terminal.send_input("x")
    await _until(terminal, seen, b"key x")
    await terminal.send_input("q")
    await _until(terminal, seen, b"\x1b[?1049l")  # back from the alternate screen
    assert await asyncio.wait_for(terminal.wait(), WAIT) == 0


async def test_a_volume_keeps_a_file_across_two_sandboxes(workstation: LiveServer) -> None:
    async with AsyncRingfence(url=workstation.url, api_key=workstation.key) as rf:
        volume = await rf.volumes.create("agent-cache")
        try:
            mounts = [{"name": "agent-cache", "path": "/mnt/cache"}]
            async with await AsyncSandbox.create(
                url=workstation.url, api_key=workstation.key, volumes=mounts
            ) as first:
                wrote = await first.commands.run("echo built > /mnt/cache/artifact && id -u")
                assert wrote.exit_code == 0, wrote.stderr
            async with await AsyncSandbox.create(
                url=workstation.url, api_key=workstation.key, volumes=mounts
            ) as second:
                read = await second.commands.run("cat /mnt/cache/artifact")
                assert read.stdout == "built\n", read.stderr
            assert await rf.volumes.read_file(volume.name, "artifact") == b"built\n"
        finally:
            await rf.volumes.delete(volume.name)
