"""``sudo`` inside real sandboxes (issue 16: "root inside, never on the host"): any process of
the sandbox runs a command as root inside through its daemon (``sandboxd/_sudo.py``), with
its own stdin, stdout and stderr, its exit status and its signals; the request channel is
the sandbox's own (an abstract socket of its network namespace), and what hostile code
sends on it is refused without harming the daemon."""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ringfence.store import MemoryStore, Store
from tests.server._envd import Ran, run
from tests.server.conftest import Api

pytestmark = pytest.mark.integration


@pytest.fixture
def store() -> Store:
    return MemoryStore()


async def _create(api: Api) -> str:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json={})
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


@pytest.fixture
async def sandbox(api: Api) -> AsyncIterator[str]:
    sandbox_id = await _create(api)
    yield sandbox_id
    await api.client.delete(f"/v1/sandboxes/{sandbox_id}", headers=api.acme)


async def _sh(api: Api, sandbox: str, script: str) -> Ran:
    """``script`` run by the sandbox user (the default), as sh."""
    return await run(api.client, api.acme, sandbox, ["sh", "-c", script])


def _exit(ran: Ran) -> int:
    assert ran.error is None, ran
    code: int = ran.end.get("exitCode", 0)
    return code


async def test_sudo_runs_as_root_inside_with_the_callers_stdio(api: Api, sandbox: str) -> None:
    ran = await _sh(
        api,
        sandbox,
        "id -u; sudo id -u; sudo -u user id -u; echo piped | sudo cat; "
        "sudo sh -c 'echo to stderr >&2'; sudo sh -c 'exit 7'; echo status $?; "
        "sudo sh -c 'echo $USER $SUDO_USER'",
    )
    assert ran.stdout.split("\n") == [
        "1000", "0", "1000", "piped", "status 7", "root user", "",
    ], ran  # fmt: skip
    assert ran.stderr == "to stderr\n", ran
    assert _exit(ran) == 0


async def test_root_through_sudo_writes_the_system_and_keeps_the_proxy_settings(
    api: Api, sandbox: str
) -> None:
    ran = await _sh(
        api,
        sandbox,
        "sudo sh -c 'echo made > /etc/made-by-sudo' && stat -c '%u %a' /etc/made-by-sudo && "
        "touch /etc/not-by-user 2>/dev/null; echo user $?; "
        "FOO=kept sudo sh -c 'echo $FOO'; [ \"$(sudo -i pwd)\" = \"$(sudo sh -c 'echo $HOME')\" ] "
        "&& echo login home; sudo -l | tail -1",
    )
    assert ran.stdout.split("\n") == [
        "0 644", "user 1", "kept", "login home", "    (ALL) NOPASSWD: ALL", "",
    ], ran  # fmt: skip


async def test_signals_reach_the_command_and_its_status_comes_back(api: Api, sandbox: str) -> None:
    # The root command says it is ready by a file; the caller waits for it (bounded), then
    # interrupts sudo: the command gets the signal, and sudo ends with the command's status.
    ran = await _sh(
        api,
        sandbox,
        textwrap.dedent(
            """
            sudo sh -c 'trap "echo interrupted; exit 3" INT; touch /tmp/ready; \
                        while :; do sleep 0.05; done' &
            pid=$!
            for i in $(seq 400); do [ -e /tmp/ready ] && break; sleep 0.05; done
            kill -INT $pid; wait $pid; echo "sudo ended $?"
            stat -c %u /tmp/ready
            """
        ),
    )
    assert ran.stdout.split("\n") == ["interrupted", "sudo ended 3", "0", ""], ran


async def test_the_seccomp_filter_and_the_namespace_hold_under_sudo(api: Api, sandbox: str) -> None:
    ran = await _sh(
        api,
        sandbox,
        "sudo unshare -U true 2>/dev/null; echo userns $?; "
        'sudo sh -c \'grep -E "^(NoNewPrivs|Seccomp):" /proc/self/status | tr -s "\\t" " "\'; '
        "sudo cat /proc/self/uid_map | awk '{print $1, ($2 == 0)}'",
    )
    lines = ran.stdout.split("\n")
    assert lines[0] != "userns 0", ran
    assert lines[1:3] == ["NoNewPrivs: 1", "Seccomp: 2"], ran
    assert lines[3:5] == ["0 0", "1000 0"], "ns root is never host root"


_HOSTILE = """
import json, os, socket
def ask(marker, fds, body):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect("\\0ringfence-sudo")
    socket.send_fds(conn, [marker], fds)
    if body:
        conn.sendall(body)
    conn.shutdown(socket.SHUT_WR)
    answer = b""
    while chunk := conn.recv(4096):
        answer += chunk
    return json.loads(answer)["error"] if answer else "closed"
def good(**change):
    request = {"argv": ["id", "-u"], "env": {}, "cwd": "/", "user": "root", **change}
    return json.dumps(request).encode() + b"\\n"
out = [
    ask(b"R", [], good()),
    ask(b"R", [0, 1], good()),
    ask(b"R", [0, 1, 2, 0], good()),
    ask(b"R", [0, 1, 2], b"not json\\n"),
    ask(b"R", [0, 1, 2], good(user="nobody")),
    ask(b"R", [0, 1, 2], good(argv=[])),
    ask(b"R", [0, 1, 2], good(cwd="relative")),
    ask(b"R", [0, 1, 2], good(env={"A=B": "x"})),
    ask(b"R", [0, 1, 2], good(argv=["/no/such/program"])),
    ask(b"R", [0, 1, 2], b"x" * (300 << 10)),
    ask(b"R", [0, 1, 2], b""),
]
print("RESULT " + json.dumps(out))
"""


async def test_hostile_requests_are_refused_and_the_daemon_keeps_serving(
    api: Api, sandbox: str
) -> None:
    ran = await run(api.client, api.acme, sandbox, ["python3", "-c", _HOSTILE])
    assert "RESULT " in ran.stdout, ran
    results: list[Any] = json.loads(ran.stdout.split("RESULT ", 1)[1])
    assert results[:3] == [
        "expected 3 descriptors (stdin, stdout, stderr), got 0",
        "expected 3 descriptors (stdin, stdout, stderr), got 2",
        "expected 3 descriptors (stdin, stdout, stderr), got 4",
    ], results
    assert "JSON" in results[3], results
    assert results[4].startswith("unknown user 'nobody'"), results
    assert results[5:8] == [
        "argv must be 1 to 4096 strings",
        "cwd must be an absolute path",
        "env must map names to strings",
    ], results
    assert "No such file or directory" in results[8], results
    assert results[9:] == ["the request is too large", "the request ended early"], results
    again = await _sh(api, sandbox, "sudo id -u")
    assert again.stdout == "0\n", again


_LISTEN = (
    "import socket; s = socket.socket(socket.AF_UNIX); s.bind('\\0probe-sudo'); s.listen(); "
    "open('/tmp/bound', 'w').close(); [s.accept()[0].close() for _ in iter(int, 1)]"
)
_PROBE = (
    "python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('\\0probe-sudo'); "
    "print('reached')\" 2>&1 | tail -1"
)


async def test_another_sandbox_cannot_reach_this_sandboxs_channel(api: Api, sandbox: str) -> None:
    """Abstract sockets are per network namespace: one that this sandbox listens on is not
    there for another sandbox (so neither is its daemon's sudo)."""
    started = await _sh(
        api,
        sandbox,
        f'setsid python3 -c "{_LISTEN}" </dev/null >/dev/null 2>&1 & '
        "for i in $(seq 400); do [ -e /tmp/bound ] && exit 0; sleep 0.05; done; exit 1",
    )
    assert _exit(started) == 0, started
    other = await _create(api)
    try:
        probe = await _sh(api, other, _PROBE)
    finally:
        await api.client.delete(f"/v1/sandboxes/{other}", headers=api.acme)
    own = await _sh(api, sandbox, _PROBE)
    assert own.stdout == "reached\n", own
    assert "ConnectionRefusedError" in probe.stdout, probe


_HOLD = """
import os, socket, sys, time
held = []
for _ in range({count}):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect("\\0ringfence-sudo")
    held.append(conn)
{then}
"""


async def test_idle_connections_are_bounded_and_sudo_comes_back(api: Api, sandbox: str) -> None:
    """A process holding more idle connections than the daemon serves at once gets the rest
    closed unanswered; a sudo meanwhile fails at once (never hangs); once they go, sudo
    works again."""
    then = (
        "import subprocess\n"
        "done = subprocess.run(['sudo', 'id', '-u'], capture_output=True, text=True, timeout=60)\n"
        "print('during', done.returncode, done.stderr.strip())"
    )
    ran = await run(
        api.client, api.acme, sandbox, ["python3", "-c", _HOLD.format(count=70, then=then)]
    )
    assert ran.stdout.startswith("during 1 sudo: the sandbox's daemon closed the connection"), ran
    again = await _sh(
        api,
        sandbox,
        'for i in $(seq 200); do [ "$(sudo id -u 2>/dev/null)" = 0 ] && exit 0; sleep 0.05; '
        "done; exit 1",
    )
    assert _exit(again) == 0, again


async def test_descriptors_sent_to_sudo_never_reach_other_commands(api: Api, sandbox: str) -> None:
    """A request whose descriptors have arrived but whose body has not: a command the
    daemon starts meanwhile inherits none of them (they are received close-on-exec)."""
    hold = (
        "import os, socket\n"
        "conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "conn.connect('\\0ringfence-sudo')\n"
        "r, w = os.pipe()\n"
        "socket.send_fds(conn, [b'R'], [r, r, r])\n"
        "open('/tmp/sent', 'w').close()\n"
        "import signal; signal.pause()\n"
    )
    started = await _sh(
        api,
        sandbox,
        f'setsid python3 -c "{hold}" </dev/null >/dev/null 2>&1 & '
        "for i in $(seq 400); do [ -e /tmp/sent ] && exit 0; sleep 0.05; done; exit 1",
    )
    assert _exit(started) == 0, started
    listed = await run(
        api.client,
        api.acme,
        sandbox,
        ["python3", "-c", "import os; print(os.listdir('/proc/self/fd'))"],
    )
    assert sorted(json.loads(listed.stdout.replace("'", '"'))) == ["0", "1", "2", "3"], listed
