"""Attacks through the sandbox API's file and process calls: every path resolves inside the
sandbox. Symlinks, '..' and /proc tricks never reach a host file, and nothing written from
a sandbox lands on the host or in another sandbox. Each runs as the sandbox user and again
as root inside (issue 16): root's capabilities hold in the sandbox's own namespace only."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ringfence.backends.local.interactive import prepare_daemon
from ringfence.config import Config
from tests.server._envd import run
from tests.server.conftest import Api


@pytest.fixture
def host_secret() -> Iterator[Path]:
    """A host file a sandbox must never read, in places sandboxes have their own copies of."""
    secret = Path("/tmp", f"ringfence-secret-{uuid.uuid4().hex}")
    secret.write_text("host secret\n")
    secret.chmod(0o644)  # even world-readable: the sandbox simply cannot name it
    yield secret
    secret.unlink()


@pytest.fixture(params=["user", "root"])
def user(request: pytest.FixtureRequest) -> str:
    """Who the calls act as inside the sandbox."""
    who: str = request.param
    return who


@pytest.fixture
async def sandbox(live: Api) -> AsyncIterator[str]:
    created = await live.client.post("/v1/sandboxes", headers=live.acme, json={})
    assert created.status_code == 201
    yield created.json()["id"]


async def _read(live: Api, sandbox: str, path: str, user: str) -> tuple[int, bytes]:
    response = await live.client.get(
        f"/v1/sandboxes/{sandbox}/files",
        headers=live.acme,
        params={"path": path, "user": user},
    )
    return response.status_code, response.content


async def _write(live: Api, sandbox: str, path: str, user: str, data: bytes = b"pwned") -> int:
    response = await live.client.put(
        f"/v1/sandboxes/{sandbox}/files",
        headers=live.acme,
        params={"path": path, "user": user},
        content=data,
    )
    return response.status_code


async def _rpc(live: Api, sandbox: str, method: str, user: str, **body: object) -> int:
    response = await live.client.post(
        f"/v1/sandboxes/{sandbox}/rpc/filesystem.Filesystem/{method}",
        headers=live.acme,
        params={"user": user},
        json=body,
    )
    return response.status_code


def _not_found(status: int, path: str, user: str) -> bool:
    """404, or (the sandbox user) a refusal to enter /proc/1: the sandbox's init is root's."""
    return status == 404 or (user == "user" and "/proc/1/" in path and status == 400)


async def test_dot_dot_and_proc_paths_never_read_a_host_file(
    live: Api, sandbox: str, host_secret: Path, user: str
) -> None:
    escapes = [
        str(host_secret),
        f"../../../../../../..{host_secret}",
        f"/home/user/../../..{host_secret}",
        f"/proc/1/root{host_secret}",
        f"/proc/self/root{host_secret}",
        f"/proc/self/cwd/../../..{host_secret}",
        f"/proc/1/cwd/../../..{host_secret}",
    ]
    for path in escapes:
        status, body = await _read(live, sandbox, path, user)
        assert _not_found(status, path, user) and b"host secret" not in body, (path, status, body)


async def test_symlinks_made_inside_resolve_inside(
    live: Api, sandbox: str, host_secret: Path, user: str
) -> None:
    ran = await run(
        live.client,
        live.acme,
        sandbox,
        ["sh", "-c", f"ln -s {host_secret} leak && ln -s / root && ln -s /proc/1/root init"],
        user=user,
    )
    assert ran.end.get("exitCode", 0) == 0, ran
    for path, resolved in (
        ("leak", str(host_secret)),
        (f"root{host_secret}", str(host_secret)),
        (f"init{host_secret}", f"/proc/1/root{host_secret}"),
    ):
        status, body = await _read(live, sandbox, path, user)
        assert _not_found(status, resolved, user) and b"host secret" not in body, (path, status)
    # Writing through them lands in the sandbox's own /tmp, not the host's.
    target = f"ringfence-dropped-{uuid.uuid4().hex}"
    assert await _write(live, sandbox, f"root/tmp/{target}", user) == 200
    assert not Path("/tmp", target).exists()
    status, body = await _read(live, sandbox, f"/tmp/{target}", user)
    assert (status, body) == (200, b"pwned")


async def test_nothing_of_the_host_changes_whatever_the_sandbox_writes(
    live: Api, sandbox: str, user: str
) -> None:
    """A sandbox on a volume has a writable root (issue 16): its writes to /usr and /etc
    land in its own upper layer, so they may succeed; the host's files never change. On a
    read-only root they are refused."""
    before = {path: _digest(path) for path in ("/etc/passwd", "/usr/bin/true")}
    for path in ("/etc/passwd", "/usr/bin/true", "/../../etc/passwd", "/usr/lib/evil.so"):
        assert await _write(live, sandbox, path, user) in (200, 400, 403, 404), path
    for method, body in (
        ("Remove", {"path": "/usr/bin/true"}),
        ("MakeDir", {"path": "/usr/ringfence-evil"}),
        ("Move", {"source": "/usr/bin/true", "destination": "/home/user/true"}),
        ("Move", {"source": "/home/user", "destination": "/usr/home"}),
    ):
        status = await _rpc(live, sandbox, method, user, **body)
        assert status in (200, 400, 403, 404), (method, body)
    assert {path: _digest(path) for path in before} == before
    assert not Path("/usr/lib/evil.so").exists() and not Path("/usr/ringfence-evil").exists()


async def test_a_sandbox_cannot_poison_the_daemon_of_others(
    live: Api, sandbox: str, user: str
) -> None:
    """The daemon's code is bound read-only into every sandbox from one host copy."""
    daemon = prepare_daemon(Config().runtime_dir)
    before = {p.name: _digest(str(p)) for p in daemon.glob("*.py")}
    main = "/run/ringfence/sandboxd/__main__.py"
    evil = b"import os; os.system('evil')"
    assert await _write(live, sandbox, main, user, evil) in (400, 403)
    assert await _rpc(live, sandbox, "Remove", user, path="/run/ringfence/sandboxd") in (400, 403)
    ran = await run(live.client, live.acme, sandbox, ["sh", "-c", f"echo x >> {main}"], user=user)
    assert ran.end.get("exitCode", 0) != 0
    assert {p.name: _digest(str(p)) for p in daemon.glob("*.py")} == before


async def test_the_daemon_socket_is_out_of_reach(live: Api, sandbox: str, user: str) -> None:
    """The host's end of the daemon's socket is a path the sandbox cannot name."""
    ran = await run(
        live.client,
        live.acme,
        sandbox,
        [
            "sh",
            "-c",
            "ls /run/ringfence; ls /run/ringfence/sockets 2>&1",
        ],
        user=user,
    )
    # The daemon's package, and the sudo client's directory when root inside is served.
    assert ran.stdout.splitlines()[0].split() in (["sandboxd"], ["bin"]), ran.stdout
    assert "sandboxd" in ran.stdout.split() and "sockets" not in ran.stdout.split(), ran.stdout
    assert "No such file" in ran.stdout


async def test_one_sandbox_cannot_reach_another(live: Api, sandbox: str, user: str) -> None:
    other = (await live.client.post("/v1/sandboxes", headers=live.acme, json={})).json()["id"]
    assert await _write(live, other, "secret.txt", user, b"other's") == 200
    ran = await run(
        live.client,
        live.acme,
        sandbox,
        ["sh", "-c", "cat /proc/*/root/home/user/secret.txt 2>&1; ps -e -o pid= | wc -l"],
        user=user,
    )
    assert "other's" not in ran.stdout


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
