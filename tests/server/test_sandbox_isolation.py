"""The sandbox boundary seen from inside real sandboxes behind a real server (issue 14).

- Socket families: only unix, inet, inet6 and netlink exist, in interactive sandboxes and
  one-shot executions alike. vsock is not network-namespaced (it reaches the hypervisor of a
  VM host, past the empty network namespace and the egress proxy); the others are attack
  surface nothing in a sandbox needs. Every other family fails with EAFNOSUPPORT.
- ptrace equivalents: a command cannot take the daemon's descriptors (pidfd_getfd) nor read
  its /proc files or memory; the daemon is non-dumpable and pidfd_getfd and kcmp are denied.
- Host uids of its own per live sandbox (two for an interactive one: its root inside and
  its user): per-uid kernel limits (inotify instances here) are not shared between
  sandboxes, and a uid goes back to the range only once its sandbox is gone.

Each attack has a control in the same sandbox (the allowed families work, the command's own
child is readable), so that no test passes because the attacking script crashed.
"""

from __future__ import annotations

import json
import os
import random
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ringfence.config import Config
from ringfence.policy.seccomp import ALLOWED_SOCKET_FAMILIES
from ringfence.service.sandboxes import SANDBOX_ID_VARIABLE
from ringfence.store import MemoryStore, Store
from tests.server._envd import run
from tests.server.conftest import Api, _serving


@pytest.fixture
def store() -> Store:
    """One store is enough (``api`` takes it): these tests are about the sandbox."""
    return MemoryStore()


_REPORT = """
import json as _json
def report(value):
    print("RESULT " + _json.dumps(value), flush=True)
"""


def _python(script: str, *args: str) -> list[str]:
    return ["python3", "-c", _REPORT + textwrap.dedent(script), *args]


def _reported(output: str) -> Any:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, f"the script did not report exactly once:\n{output[-4000:]}"
    return json.loads(lines[0].removeprefix("RESULT "))


@pytest.fixture
async def sandbox(api: Api) -> AsyncIterator[str]:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json={})
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    yield sandbox_id
    await api.client.delete(f"/v1/sandboxes/{sandbox_id}", headers=api.acme)


@pytest.fixture(params=["user", "root"])
def user(request: pytest.FixtureRequest) -> str:
    """Who an attack runs as inside: the sandbox user, and root inside (issue 16)."""
    who: str = request.param
    return who


async def _in_sandbox(
    api: Api, sandbox: str, script: str, *args: str, user: str | None = None
) -> Any:
    ran = await run(api.client, api.acme, sandbox, _python(script, *args), user=user)
    assert ran.end.get("exitCode", 0) == 0 and ran.error is None, ran
    return _reported(ran.stdout + ran.stderr)


async def _in_execution(api: Api, script: str, *args: str) -> Any:
    response = await api.client.post(
        "/v1/executions", headers=api.acme, json={"command": _python(script, *args), "timeout": 60}
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded", response.json()
    return _reported(response.json()["logs"])


# -- socket families -------------------------------------------------------------------------

_SOCKET_FAMILIES = """
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def raw(nr, *args):
    ctypes.set_errno(0)
    fd = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if fd >= 0:
        os.close(fd)
        return "ok"
    return errno.errorcode[ctypes.get_errno()]
def outcome(make):
    try:
        made = make()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    for s in made if isinstance(made, tuple) else (made,):
        s.close()
    return "ok"
out = {"socket": {}, "socketpair": {}, "high-bits": {}}
types = (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW)
for family in range(64):
    out["socket"][family] = sorted({outcome(lambda: socket.socket(family, t)) for t in types})
    out["socketpair"][family] = outcome(lambda: socket.socketpair(family, socket.SOCK_STREAM))
    # socket(2) is 41 on x86_64. The kernel reads an int: the upper half of the register
    # must not fool the filter into letting a family through.
    out["high-bits"][family] = raw(41, family | (1 << 32), socket.SOCK_STREAM, 0)
out["allowed"] = {
    "unix": outcome(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)),
    "unix-pair": outcome(lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)),
    "inet": outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
    "inet6": outcome(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)),
    "netlink-route": outcome(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
}
# What getaddrinfo and ip rely on: a netlink route dump of the sandbox's own interfaces.
out["if_nameindex"] = socket.if_nameindex()
report(out)
"""


def _check_socket_families(out: dict[str, Any]) -> None:
    assert out["allowed"] == dict.fromkeys(
        ("unix", "unix-pair", "inet", "inet6", "netlink-route"), "ok"
    ), out["allowed"]
    assert out["if_nameindex"] == [[1, "lo"]]
    for family in range(64):
        key = str(family)
        assert out["high-bits"][key] == "EAFNOSUPPORT", (family, out["high-bits"][key])
        if family in ALLOWED_SOCKET_FAMILIES:
            continue
        assert out["socket"][key] == ["EAFNOSUPPORT"], (family, out["socket"][key])
        assert out["socketpair"][key] == "EAFNOSUPPORT", (family, out["socketpair"][key])


async def test_only_the_allowed_socket_families_exist_in_an_interactive_sandbox(
    api: Api, sandbox: str, user: str
) -> None:
    _check_socket_families(await _in_sandbox(api, sandbox, _SOCKET_FAMILIES, user=user))


async def test_only_the_allowed_socket_families_exist_in_a_one_shot_execution(api: Api) -> None:
    _check_socket_families(await _in_execution(api, _SOCKET_FAMILIES))


# -- ptrace equivalents ----------------------------------------------------------------------

_DAEMON_REACH = """
import ctypes, errno, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
PIDFD_OPEN, PIDFD_GETFD, KCMP, KCMP_FILE = 434, 438, 312, 0
def call(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return result if result >= 0 else errno.errorcode[ctypes.get_errno()]
def attempt(action):
    try:
        action()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"
def reach(pid):
    pidfd = call(PIDFD_OPEN, pid, 0)
    got = {}
    if isinstance(pidfd, int):
        for fd in range(16):
            taken = call(PIDFD_GETFD, pidfd, fd, 0)
            got[fd] = "taken" if isinstance(taken, int) else taken
            if isinstance(taken, int):
                os.close(taken)
        os.close(pidfd)
    def read(name):
        with open(f"/proc/{pid}/{name}", "rb") as f:
            f.read(1)
    def reopen(fd):
        os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK))
    opened = {attempt(lambda: reopen(fd)) for fd in range(16)} - {"ENOENT", "ENXIO"}
    return {
        "fd_open": sorted(opened),
        "fd_link": attempt(lambda: os.readlink(f"/proc/{pid}/fd/0")),
        "pidfd_open": "ok" if isinstance(pidfd, int) else pidfd,
        "pidfd_getfd": sorted(set(got.values())),
        "kcmp": call(KCMP, os.getpid(), pid, KCMP_FILE, 0, 0),
        "fd": attempt(lambda: os.listdir(f"/proc/{pid}/fd")),
        "mem": attempt(lambda: open(f"/proc/{pid}/mem", "rb").close()),
        "environ": attempt(lambda: read("environ")),
        "cwd": attempt(lambda: os.readlink(f"/proc/{pid}/cwd")),
    }
daemon = os.getppid()
child = subprocess.Popen(["sleep", "60"])
report({"parent": open(f"/proc/{daemon}/cmdline", "rb").read().decode().split(chr(0)),
        "daemon": reach(daemon), "own child": reach(child.pid)})
child.kill()
"""


async def test_a_command_cannot_take_the_daemons_descriptors_or_read_its_memory(
    api: Api, sandbox: str, user: str
) -> None:
    """Root's commands are the daemon's uid: its being non-dumpable, and root inside
    holding no CAP_SYS_PTRACE, keep them out as well."""
    out = await _in_sandbox(api, sandbox, _DAEMON_REACH, user=user)
    assert "sandboxd.__main__" in " ".join(out["parent"]), "the command's parent is the daemon"
    daemon, control = out["daemon"], out["own child"]
    # Control: /proc of a process the command started (dumpable, same uid) is readable.
    assert {k: control[k] for k in ("pidfd_open", "fd", "mem", "environ", "cwd")} == dict.fromkeys(
        ("pidfd_open", "fd", "mem", "environ", "cwd"), "ok"
    ), control
    assert daemon["pidfd_open"] == "ok", "pidfd_open itself stays (waiting on a process)"
    assert daemon["pidfd_getfd"] == ["EPERM"], daemon
    assert control["pidfd_getfd"] == ["EPERM"], "denied by the filter, whoever the target"
    assert daemon["kcmp"] == control["kcmp"] == "EPERM"
    # Root (the daemon's uid) may list the numbers of its descriptors, no more.
    names = ("mem", "environ", "cwd", "fd_link") + (("fd",) if user == "user" else ())
    for name in names:
        assert daemon[name] == "EACCES", (name, daemon)
    assert daemon["fd_open"] == ["EACCES"], daemon


# -- one host uid per live sandbox -----------------------------------------------------------


def _host_ids(sandbox_id: str) -> dict[int, tuple[str, str]]:
    """Host pid -> (real uid, real gid) of every process of the sandbox, read from the host
    (each inherits the sandbox's id in its environment)."""
    marker = f"{SANDBOX_ID_VARIABLE}={sandbox_id}\0".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if marker not in Path(f"/proc/{entry}/environ").read_bytes():
                continue
            lines = Path(f"/proc/{entry}/status").read_text().splitlines()
            status = dict(line.split(":", 1) for line in lines)
        except OSError:
            continue  # gone meanwhile
        found[int(entry)] = (status["Uid"].split()[0], status["Gid"].split()[0])
    return found


async def _create(api: Api) -> str:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json={})
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


def _the_one_id(sandbox_id: str) -> int:
    ids = set(_host_ids(sandbox_id).values())
    assert len(ids) == 1, f"sandbox {sandbox_id}: host (uid, gid) {ids}"
    uid, gid = ids.pop()
    assert uid == gid, "the gid is the uid's number"
    return int(uid)


async def test_two_live_sandboxes_run_as_different_host_uids(api: Api, sandbox: str) -> None:
    other = await _create(api)
    first, last = Config().sandbox_uids
    mine, theirs = _the_one_id(sandbox), _the_one_id(other)
    assert mine != theirs
    assert first <= mine <= last and first <= theirs <= last


_EXHAUST_INOTIFY = """
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
def instances():
    fds = []
    while True:
        fd = libc.inotify_init()
        if fd < 0:
            return fds, errno.errorcode[ctypes.get_errno()]
        fds.append(fd)
ready_r, ready_w = os.pipe()
if os.fork() == 0:  # holds every instance of the uid, after the command has answered
    os.setsid()
    fds, why = instances()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.write(ready_w, f"{len(fds)} {why}".encode())
    while True:
        time.sleep(3600)
count, why = os.read(ready_r, 100).decode().split()
again = instances()  # another process of the same sandbox
report({"count": int(count), "why": why, "again": [len(again[0]), again[1]],
        "max": int(open("/proc/sys/fs/inotify/max_user_instances").read())})
"""

_ONE_INOTIFY = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
report("ok" if fd >= 0 else errno.errorcode[ctypes.get_errno()])
"""


async def test_one_sandbox_exhausting_its_inotify_instances_leaves_others_theirs(
    api: Api, sandbox: str, user: str
) -> None:
    other = await _create(api)
    held = await _in_sandbox(api, sandbox, _EXHAUST_INOTIFY, user=user)
    # The per-uid limit, not the descriptor limit: a second process of the same sandbox
    # gets none either.
    assert held["why"] == "EMFILE" and 0 < held["count"] <= held["max"], held
    assert held["again"] == [0, "EMFILE"], held
    assert await _in_sandbox(api, other, _ONE_INOTIFY) == "ok"
    watched = await api.client.post(
        f"/v1/sandboxes/{other}/rpc/filesystem.Filesystem/CreateWatcher",
        headers=api.acme,
        json={"path": "/home/user"},
    )
    assert watched.status_code == 200, watched.text
    still = await _in_sandbox(api, sandbox, _ONE_INOTIFY, user=user)
    assert still == "EMFILE", "control: still held"


@pytest.fixture
async def one_uid(monkeypatch: pytest.MonkeyPatch, local_host: object) -> AsyncIterator[Api]:
    """A server whose sandbox range holds one interactive sandbox: two uids, its root
    inside and its user (outside the default range, picked at random so that concurrent
    runs of this test do not meet)."""
    uid = random.randrange(1_990_000_000, 1_999_999_998)
    monkeypatch.setenv("RINGFENCE_SANDBOX_UID_RANGE", f"{uid}-{uid + 1}")
    async with _serving(local_host, MemoryStore()) as api:
        yield api


async def test_a_uid_is_reused_only_after_its_sandbox_is_gone_and_never_shared(
    one_uid: Api,
) -> None:
    api = one_uid
    uid = Config().sandbox_uids[0]
    first = await _create(api)
    assert _the_one_id(first) == uid, "the daemon runs as the sandbox's root inside"
    ran_as = await _in_sandbox(api, first, "import os; report(os.getuid())")
    assert ran_as == 1000, "a command runs as the sandbox user: the range's second uid"
    refused = await api.client.post("/v1/sandboxes", headers=api.acme, json={})
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "sandbox_uids_exhausted"
    execution = await api.client.post(
        "/v1/executions", headers=api.acme, json={"command": ["true"]}
    )
    assert execution.status_code == 503, execution.text
    assert execution.json()["error"]["code"] == "sandbox_uids_exhausted"
    killed = await api.client.delete(f"/v1/sandboxes/{first}", headers=api.acme)
    assert killed.status_code in (200, 204), killed.text
    second = await _create(api)
    assert _host_ids(first) == {}, "nothing of the first sandbox remains"
    assert _the_one_id(second) == uid
    ran = await api.client.post("/v1/executions", headers=api.acme, json={"command": ["true"]})
    assert ran.status_code == 503, "both uids are the second sandbox's alone"
