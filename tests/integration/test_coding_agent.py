"""Acceptance of the agent's workstation (issue 17): the coding agent's scenario of
DESIGN.md end to end, on a real ``ringfence serve`` with real sandboxes.

A git repository served over HTTP on this machine's loopback, under a name only the
sandbox's egress policy allows, is cloned; its dependency installs from a package index
behind the same policy; its tests run; its web server starts on a port and is queried from
inside and from outside; the agent's change is read back as a diff.

The origin (the repository and the index) is a plain HTTP server on the host's loopback,
known to the server's resolver under test names (``RINGFENCE_NETWORK_HOSTS``) and reachable
only because the operator lists loopback as an internal network the tenant may name
(``RINGFENCE_NETWORK_INTERNAL_CIDRS``): nothing leaves this machine."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import shutil
import subprocess
import threading
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from tests.client.conftest import LiveServer, _serving
from tests.server.test_serve_process import Server

from ringfence.client import AsyncSandbox

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).parent / "agent_project"
GIT_HOST = "git.example.test"
INDEX_HOST = "pypi.example.test"
APP_PORT = 8000


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


async def test_the_coding_agents_scenario(agent: AsyncSandbox, origin: int) -> None:
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

    # The agent changes the app; the change reads back as git's diff.
    await agent.files.write(
        "/home/user/app/requirements.txt", "greet==1.0\n# pinned for the demo\n"
    )
    diff = await agent.commands.run("git diff --stat", cwd="/home/user/app")
    assert "requirements.txt | 1 +" in diff.stdout, diff.stdout
