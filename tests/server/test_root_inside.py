"""Root inside, never on the host (issue 16), seen from inside real sandboxes and from the
host behind a real server.

An interactive sandbox's user namespace maps exactly two ids, ns 0 and ns 1000, to two host
uids of its own; its daemon runs as ns 0 with Docker's default capabilities; commands run as
the sandbox user (no capabilities) unless ``root`` is asked for. Every capability holds in
the sandbox's own namespace only: each attack below has a control showing the same call
works on what the sandbox owns.
"""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ringfence.backends.local.userns import DOCKER_CAPABILITIES
from ringfence.config import Config
from ringfence.service.sandboxes import SANDBOX_ID_VARIABLE
from ringfence.store import MemoryStore, Store
from tests.server._envd import run
from tests.server.conftest import Api

# Capability numbers (linux/capability.h) of Docker's default set.
_CAPABILITY_BITS = {
    "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4, "CAP_KILL": 5,
    "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_NET_BIND_SERVICE": 10,
    "CAP_NET_RAW": 13, "CAP_SYS_CHROOT": 18, "CAP_MKNOD": 27, "CAP_AUDIT_WRITE": 29,
    "CAP_SETFCAP": 31,
}  # fmt: skip
DOCKER_MASK = sum(1 << _CAPABILITY_BITS[name] for name in DOCKER_CAPABILITIES)

_REPORT = """
import json as _json
def report(value):
    print("RESULT " + _json.dumps(value), flush=True)
"""


@pytest.fixture
def store() -> Store:
    return MemoryStore()


@pytest.fixture
async def sandbox(api: Api) -> AsyncIterator[str]:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json={})
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    yield sandbox_id
    await api.client.delete(f"/v1/sandboxes/{sandbox_id}", headers=api.acme)


async def _script(api: Api, sandbox: str, script: str, user: str | None = None) -> Any:
    command = ["python3", "-c", _REPORT + textwrap.dedent(script)]
    ran = await run(api.client, api.acme, sandbox, command, user=user)
    assert ran.error is None and ran.end.get("exitCode", 0) == 0, ran
    lines = [line for line in ran.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, ran
    return json.loads(lines[0].removeprefix("RESULT "))


_CREDENTIALS = """
import os
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines()
              if ":\\t" in line)
report({
    "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()],
    "env": [os.environ.get("USER"), os.environ.get("LOGNAME")],
    **{key: int(status[key], 16) for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
    "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "uid_map": open("/proc/self/uid_map").read().split(),
    "gid_map": open("/proc/self/gid_map").read().split(),
})
"""


async def test_commands_run_as_the_sandbox_user_with_no_capabilities(
    api: Api, sandbox: str
) -> None:
    for user in (None, "user"):
        out = await _script(api, sandbox, _CREDENTIALS, user)
        assert out["ids"] == [1000, 1000, 1000, 1000, []], out
        assert out["env"] == ["user", "user"]
        assert (out["CapInh"], out["CapPrm"], out["CapEff"], out["CapAmb"]) == (0, 0, 0, 0), out
        assert (out["no_new_privs"], out["seccomp"]) == ("1", "2"), out


async def test_root_holds_dockers_capabilities_and_the_filter_stays(api: Api, sandbox: str) -> None:
    out = await _script(api, sandbox, _CREDENTIALS, "root")
    assert out["ids"] == [0, 0, 0, 0, []], out
    assert out["env"] == ["root", "root"]
    assert out["CapEff"] == out["CapPrm"] == out["CapBnd"] == DOCKER_MASK, out
    assert not out["CapBnd"] & (1 << 21), "never CAP_SYS_ADMIN"
    assert (out["no_new_privs"], out["seccomp"]) == ("1", "2"), out


async def test_the_namespace_maps_two_ids_to_host_uids_of_the_sandbox_own(
    api: Api, sandbox: str
) -> None:
    out = await _script(api, sandbox, _CREDENTIALS + "import time; time.sleep(0)")
    inside_root, host_root, one, inside_user, host_user, one_more = map(int, out["uid_map"])
    assert (inside_root, inside_user, one, one_more) == (0, 1000, 1, 1)
    assert out["gid_map"] == out["uid_map"], "gids are the same numbers"
    first, last = Config().sandbox_uids
    assert first <= host_root <= last and first <= host_user <= last
    assert host_root != host_user and 0 not in (host_root, host_user)
    # From the host: the daemon runs as the root's uid, a command as the user's.
    ids = await _host_uids_while_a_command_runs(api, sandbox)
    assert ids == {"daemon": host_root, "command": host_user}, (ids, out["uid_map"])


async def _host_uids_while_a_command_runs(api: Api, sandbox: str) -> dict[str, int]:
    marker = f"{SANDBOX_ID_VARIABLE}={sandbox}\0".encode()
    ran = run(api.client, api.acme, sandbox, ["sleep", "30.5"])
    task = asyncio.create_task(ran)
    found: dict[str, int] = {}
    try:
        for _ in range(200):
            found = {}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if marker not in Path(f"/proc/{pid}/environ").read_bytes():
                        continue
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                uid = int(status.split("Uid:")[1].split()[0])
                if b"sandboxd.__main__" in cmdline and b"bwrap" not in cmdline:
                    found["daemon"] = uid
                elif cmdline == b"sleep\x0030.5\x00":
                    found["command"] = uid
            if len(found) == 2:
                return found
            await asyncio.sleep(0.05)
        return found
    finally:
        task.cancel()


_TAMPER = """
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
daemon = os.getppid()
def attempt(call):
    try:
        call()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def ptrace():
    if libc.ptrace(16, daemon, 0, 0) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
report({
    "kill": attempt(lambda: os.kill(daemon, signal.SIGKILL)),
    "stop": attempt(lambda: os.kill(daemon, signal.SIGSTOP)),
    "init": attempt(lambda: os.kill(1, signal.SIGKILL)),
    "ptrace": attempt(ptrace),
    "environ": attempt(lambda: open(f"/proc/{daemon}/environ", "rb").read()),
})
"""


async def test_a_user_command_cannot_kill_stop_or_trace_the_daemon(api: Api, sandbox: str) -> None:
    out = await _script(api, sandbox, _TAMPER)
    assert out["kill"] == out["stop"] == out["init"] == "EPERM", out
    assert out["ptrace"] == "EPERM" and out["environ"] == "EACCES", out
    # The daemon is still there and answers.
    again = await _script(api, sandbox, "import os; report(os.getuid())")
    assert again == 1000


_ROOT_LIMITS = """
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def attempt(call):
    try:
        call()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def checked(result):
    if result != 0:
        raise OSError(ctypes.get_errno(), "call")
mine = f"/tmp/mine-{os.getuid()}"
open(mine, "w").close()
out = {
    # What root's capabilities do on what the sandbox owns (controls):
    "chown_to_user": attempt(lambda: os.chown(mine, 1000, 1000)),
    "chown_back": attempt(lambda: os.chown(mine, 0, 0)),
    # What only host root could do:
    "chown_unmapped": attempt(lambda: os.chown(mine, 4242, 4242)),
    "mount": attempt(lambda: checked(libc.mount(b"none", b"/mnt", b"tmpfs", 0, None))),
    "mknod_char": attempt(lambda: os.mknod(mine + "-null", 0o20666, os.makedev(1, 3))),
    "sethostname": attempt(lambda: checked(libc.sethostname(b"evil", 4))),
    "unshare_user": attempt(lambda: checked(libc.unshare(0x10000000))),
    "max_userns": open("/proc/sys/user/max_user_namespaces").read().strip(),
    "raise_max_userns": attempt(
        lambda: open("/proc/sys/user/max_user_namespaces", "w").write("10")),
    "write_usr": attempt(lambda: open("/usr/bin/ringfence-evil", "w").close()),
    "write_etc": attempt(lambda: open("/etc/passwd", "a").close()),
    "kernel_setting": attempt(lambda: open("/proc/sys/kernel/hostname", "w").write("x")),
    "module": attempt(lambda: checked(libc.syscall(313, -1, b"", 0))),  # finit_module
}
report(out)
"""


async def test_root_inside_cannot_do_what_only_host_root_can(api: Api, sandbox: str) -> None:
    out = await _script(api, sandbox, _ROOT_LIMITS, "root")
    assert out["chown_to_user"] == out["chown_back"] == "ok", out
    assert out["chown_unmapped"] == "EINVAL", out
    assert out["mount"] == "EPERM" and out["sethostname"] == "EPERM", out
    assert out["mknod_char"] == "EPERM", out
    assert out["unshare_user"] == "EPERM", "the seccomp filter, for root too"
    assert out["max_userns"] == "0" and out["raise_max_userns"] in ("EACCES", "EPERM"), out
    # A writable root (a volume's overlay) takes root's writes into the sandbox's own layer;
    # the host's files never change.
    assert out["write_usr"] in ("ok", "EROFS") and out["write_etc"] in ("ok", "EROFS"), out
    assert not Path("/usr/bin/ringfence-evil").exists()
    as_user = await _script(api, sandbox, _ROOT_LIMITS)
    assert as_user["write_usr"] in ("EACCES", "EROFS"), "the system is root's"
    assert as_user["write_etc"] in ("EACCES", "EROFS"), as_user
    assert as_user["chown_back"] == "EPERM" and as_user["mknod_char"] == "EPERM", as_user
    assert out["kernel_setting"] in ("EROFS", "EACCES", "EPERM"), out
    assert out["module"] == "EPERM", out


async def _upload(api: Api, sandbox: str, path: str, user: str | None, data: bytes) -> int:
    params = {"path": path} | ({} if user is None else {"user": user})
    response = await api.client.put(
        f"/v1/sandboxes/{sandbox}/files", headers=api.acme, params=params, content=data
    )
    return response.status_code


async def _download(api: Api, sandbox: str, path: str, user: str | None) -> tuple[int, bytes]:
    params = {"path": path} | ({} if user is None else {"user": user})
    response = await api.client.get(
        f"/v1/sandboxes/{sandbox}/files", headers=api.acme, params=params
    )
    return response.status_code, response.content


async def test_files_belong_to_who_wrote_them_and_root_only_files_stay_roots(
    api: Api, sandbox: str
) -> None:
    assert await _upload(api, sandbox, "by-user.txt", None, b"u") == 200
    assert await _upload(api, sandbox, "by-root.txt", "root", b"r") == 200
    assert await _upload(api, sandbox, "/tmp/secret", "root", b"root's") == 200
    owners = await _script(
        api,
        sandbox,
        """
        import os
        os.chmod("/tmp/secret", 0o600) if os.getuid() == 0 else None
        report({name: os.stat(name).st_uid for name in ("by-user.txt", "by-root.txt")})
        """,
        "root",
    )
    assert owners == {"by-user.txt": 1000, "by-root.txt": 0}
    assert await _download(api, sandbox, "/tmp/secret", "root") == (200, b"root's")
    status, body = await _download(api, sandbox, "/tmp/secret", None)
    assert status in (400, 403) and b"root's" not in body, (status, body)


async def test_a_user_the_sandbox_does_not_have_is_refused(api: Api, sandbox: str) -> None:
    """Never run as someone else."""
    ran = await api.client.post(
        f"/v1/sandboxes/{sandbox}/rpc/process.Process/List",
        headers=api.acme,
        params={"user": "bob"},
        json={},
    )
    assert ran.status_code == 400, ran.text  # not one of the two users the route takes
    assert ran.json()["error"]["code"] == "invalid_request"
