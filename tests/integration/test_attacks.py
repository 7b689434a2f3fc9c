"""Attacks on the local sandbox. Each test runs one attack; every one of them must fail.

Every test asserts positive evidence: the attack got the specific error the defence causes
(not just "something went wrong"), and where it matters a control shows that the same code
works on something the sandbox is granted, so that a test cannot pass because the attacking
script crashed. Host-side facts (processes, cgroups, files) are read from the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _attack_helpers import (
    TRUNCATION_MARKER,
    RootInside,
    cgroup_dirs,
    cgroup_procs,
    eventually,
    host_ipv4_addresses,
    marker,
    named,
    pids_cgroup_dir,
    pids_with_argument,
    proc_status,
    python,
    read_counter,
    reported,
    start,
    vm_kib,
)

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.bwrap import DEFAULT_PATH
from ringfence.backends.local.probe import Host
from ringfence.backends.local.rootfs import GENERATED_ETC
from ringfence.backends.local.volume import VOLUMES
from ringfence.config import Config
from ringfence.models import ExecutionRequest, ExecutionResult, Mount, ResourceLimits, Status

pytestmark = pytest.mark.integration

# Each live sandbox runs as a host uid of its own from this range (the gid of the same
# number). Host permissions treat every uid of it alike: none owns a file the tests make.
SANDBOX_UIDS = range(Config().sandbox_uids[0], Config().sandbox_uids[1] + 1)
SANDBOX_UID = SANDBOX_GID = SANDBOX_UIDS[0]
SANDBOX_PYTHON = shutil.which("python3", path=DEFAULT_PATH) or "/usr/bin/python3"
MiB = 1 << 20


async def run(executor: LocalExecutor, command: list[str], **fields: object) -> ExecutionResult:
    """Run one request to its end; a short default timeout keeps a broken defence fast."""
    fields.setdefault("timeout", 8)
    return await executor.execute(ExecutionRequest(command=command, **fields))  # type: ignore[arg-type,unused-ignore]


# What these pin differs as root inside by design, and is pinned for root elsewhere: root
# writes its own layer of a writable root (tests/integration/test_volume.py,
# tests/server/test_sandbox_attacks.py: the host never changes), a volume bounds disk and
# checkpoints together (test_volume.py), root holds Docker's capabilities and its files are
# ns 0's (tests/server/test_root_inside.py). Found as root: bwrap leaves the read end of its
# --userns-block-fd pipe (empty, writer closed) open in the command; the daemon of an
# interactive sandbox, the only root-inside command, never lets its commands inherit it.
_AS_THE_USER_ONLY = pytest.mark.parametrize("local_executor", ["user"], indirect=True)


@pytest.fixture(params=["user", "root"])
async def local_executor(request: pytest.FixtureRequest, local_host: Host) -> Any:
    """Each attack as the sandbox user and again as root inside: the defences must hold."""
    made = (LocalExecutor if request.param == "user" else RootInside)(Config(), host=local_host)
    yield made
    await made.aclose()


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A host directory every user may enter: only the sandbox, not file permissions, can
    keep the sandbox user (a host uid of ``sandbox_uid_range``) out of it."""
    directory = Path(tempfile.mkdtemp(prefix="ringfence-attack-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def world_file(path: Path, content: str, mode: int = 0o644) -> Path:
    path.write_text(content)
    path.chmod(mode)
    return path


# -- 1. reading host files -------------------------------------------------------------------

_READ_SCRIPT = """
import errno, sys
out = {}
for path in sys.argv[1:]:
    try:
        with open(path) as f:
            out[path] = {"content": f.read()}
    except OSError as e:
        out[path] = {"errno": errno.errorcode[e.errno]}
report(out)
"""


async def test_cannot_read_an_ungranted_host_file(local_executor: LocalExecutor) -> None:
    secret = marker("secret")
    name = f".{marker('canary')}"
    canary_dir = Path(tempfile.mkdtemp(prefix="ringfence-canary-"))
    granted_dir = Path(tempfile.mkdtemp(prefix="ringfence-granted-"))
    host_canaries = [canary_dir / "canary", Path("/root", name), Path("/etc", name)]
    try:
        # World-readable in world-traversable directories: the sandbox user could read the
        # /tmp one on the host. Only the sandbox's filesystem view can keep it out.
        canary_dir.chmod(0o755)
        granted_dir.chmod(0o755)
        for path in host_canaries:
            world_file(path, secret)
        as_sandbox_user = subprocess.run(
            ["cat", str(canary_dir / "canary")], user=SANDBOX_UID, group=SANDBOX_GID,
            extra_groups=[], capture_output=True, text=True,
        )  # fmt: skip
        assert as_sandbox_user.stdout == secret, "control: permissions alone would allow it"
        allowed = marker("allowed")
        world_file(granted_dir / "allowed", allowed)
        (granted_dir / "escape").symlink_to(canary_dir / "canary")
        (granted_dir / "escape-etc").symlink_to(Path("/etc", name))
        attempts = [
            *map(str, host_canaries),
            f"/proc/1/root{canary_dir}/canary",
            f"/proc/self/root/etc/{name}",
            "/mnt/granted/escape",
            "/mnt/granted/escape-etc",
        ]
        result = await run(
            local_executor,
            python(_READ_SCRIPT, "/mnt/granted/allowed", *attempts),
            mounts=[Mount(source=str(granted_dir), target="/mnt/granted")],
        )  # fmt: skip
        out = reported(result)
        assert out["/mnt/granted/allowed"] == {"content": allowed}, "control: a granted read"
        for attempt in attempts:
            assert out[attempt] == {"errno": "ENOENT"}, f"{attempt} is visible: {out[attempt]}"
        assert secret not in result.logs
        assert result.status is Status.SUCCEEDED
    finally:
        for path in host_canaries:
            path.unlink(missing_ok=True)
        shutil.rmtree(canary_dir, ignore_errors=True)
        shutil.rmtree(granted_dir, ignore_errors=True)


async def test_cannot_read_a_protected_file_in_an_allowlisted_etc_directory() -> None:
    # /etc/ssl is on the /etc allowlist; its private/ directory is not for other users.
    # The backend prepares the /etc it shows when it starts: start one after planting.
    private = Path("/etc/ssl/private")
    directory = private if private.is_dir() else Path("/etc/ssl")
    canary = directory / f"{marker('key')}.key"
    secret = marker("private-key")
    config = Config()
    times = os.stat(directory)
    copies_before = set(config.runtime_dir.glob("*"))
    try:
        world_file(canary, secret, mode=0o600)
        as_sandbox_user = subprocess.run(
            ["cat", str(canary)], user=SANDBOX_UID, group=SANDBOX_GID, extra_groups=[],
            capture_output=True, text=True,
        )  # fmt: skip
        assert as_sandbox_user.returncode != 0, "control: host permissions protect the file"
        executor = LocalExecutor(config)
        try:
            result = await run(executor, python(_READ_SCRIPT, "/etc/ssl/openssl.cnf", str(canary)))
        finally:
            await executor.aclose()
        out = reported(result)
        assert "content" in out["/etc/ssl/openssl.cnf"], "control: /etc/ssl is shown"
        assert out[str(canary)] in ({"errno": "EACCES"}, {"errno": "ENOENT"}), out[str(canary)]
        assert secret not in result.logs
    finally:
        canary.unlink(missing_ok=True)
        os.utime(directory, ns=(times.st_atime_ns, times.st_mtime_ns))
        # The copy of /etc the backend made for the planted state (a test by-product).
        for made in set(config.runtime_dir.glob("etc-*")) - copies_before:
            shutil.rmtree(made, ignore_errors=True)


# -- 2. writing outside the workspace --------------------------------------------------------

_WRITE_SCRIPT = """
import errno, os, sys
out = {}
for spec in sys.argv[1:]:
    mode, path = spec.split(":", 1)
    try:
        if mode == "mkdir":
            os.mkdir(path)
        elif mode == "unlink":
            os.unlink(path)
        else:
            with open(path, mode) as f:
                f.write("written-by-the-sandbox")
        out[spec] = "ok"
    except OSError as e:
        out[spec] = errno.errorcode[e.errno]
report(out)
"""


@_AS_THE_USER_ONLY
async def test_cannot_write_outside_the_workspace(
    local_executor: LocalExecutor, world_dir: Path
) -> None:
    name = marker("written")
    read_only = world_dir / "ro"
    writable = world_dir / "rw"
    for directory in (read_only, writable):
        directory.mkdir()
        directory.chmod(0o777)  # host permissions would let the sandbox user write here
    existing = world_file(read_only / "existing", "original", mode=0o666)
    must_fail = {
        f"w:/usr/{name}": ("EROFS", "EACCES"),  # /usr is root's on the host anyway
        f"w:/usr/bin/{name}": ("EROFS", "EACCES"),
        f"mkdir:/usr/{name}.d": ("EROFS", "EACCES"),
        f"a:{SANDBOX_PYTHON}": ("EROFS", "EACCES"),
        # Directories the sandbox user owns (or on the host, may write): only read-only
        # mounts stop these.
        f"w:/{name}": ("EROFS",),
        f"w:/etc/{name}": ("EROFS", "EACCES"),
        "a:/etc/passwd": ("EROFS", "EACCES"),
        f"w:/var/{name}": ("EROFS",),
        f"w:/dev/{name}": ("EROFS",),
        f"w:/mnt/ro/{name}": ("EROFS",),
        "a:/mnt/ro/existing": ("EROFS",),
        "unlink:/mnt/ro/existing": ("EROFS",),
    }
    must_work = [
        f"w:/home/user/{name}",
        f"w:/tmp/{name}",
        f"w:/var/tmp/{name}.var",
        f"w:/dev/shm/{name}",
        f"w:/mnt/rw/{name}",
    ]
    result = await run(
        local_executor,
        python(_WRITE_SCRIPT, *must_fail, *must_work),
        mounts=[
            Mount(source=str(read_only), target="/mnt/ro", writable=False),
            Mount(source=str(writable), target="/mnt/rw", writable=True),
        ],
    )
    out = reported(result)
    for spec in must_work:
        assert out[spec] == "ok", f"control: {spec} must be writable, got {out[spec]}"
    for spec, errors in must_fail.items():
        assert out[spec] in errors, f"{spec}: expected {' or '.join(errors)}, got {out[spec]}"
    # From the host: nothing was written outside, the granted writable mount was.
    for host_path in (f"/usr/{name}", f"/usr/bin/{name}", f"/usr/{name}.d", f"/{name}",
                      f"/etc/{name}", f"/var/{name}", f"/dev/{name}"):  # fmt: skip
        assert not os.path.lexists(host_path), f"{host_path} appeared on the host"
    assert sorted(os.listdir(read_only)) == ["existing"]
    assert existing.read_text() == "original"
    assert (writable / name).read_text() == "written-by-the-sandbox"


# -- 3. host processes -----------------------------------------------------------------------

_PROCESS_SCRIPT = """
import errno, os, signal, subprocess, sys
target = int(os.environ["TARGET_PID"])
target_mark = os.environ["TARGET_MARK"].encode()
own_mark = sys.argv[1].encode()
pids, seen_target_mark, seen_own_mark = [], False, False
for name in os.listdir("/proc"):
    if name.isdigit():
        pids.append(int(name))
        try:
            words = open(f"/proc/{name}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        seen_target_mark |= target_mark in words
        seen_own_mark |= own_mark in words
out = {"pids": sorted(pids), "seen_target_mark": seen_target_mark,
       "seen_own_mark": seen_own_mark, "target_in_proc": os.path.exists(f"/proc/{target}")}
try:
    os.kill(target, signal.SIGKILL)
    out["os.kill"] = "ok"
except OSError as e:
    out["os.kill"] = errno.errorcode[e.errno]
shell = subprocess.run(["sh", "-c", f"kill -9 {target}"], capture_output=True, text=True)
out["kill -9"] = [shell.returncode, shell.stderr.strip()]
try:
    os.kill(-1, signal.SIGKILL)  # everything this user may signal, except ourselves
    out["kill(-1)"] = "ok"
except OSError as e:
    out["kill(-1)"] = errno.errorcode[e.errno]
report(out)
"""


def _assert_processes_hidden(out: dict[str, Any], target: int) -> None:
    assert out["seen_own_mark"] is True, "control: the scan finds the sandbox's own process"
    assert out["seen_target_mark"] is False, f"the target process is visible: {out}"
    assert target not in out["pids"]
    assert out["target_in_proc"] is False
    assert out["os.kill"] == "ESRCH"
    code, message = out["kill -9"]
    assert code != 0 and "No such process" in message, out["kill -9"]


async def test_cannot_see_or_signal_host_processes(local_host: object) -> None:
    target_mark = marker("host-process")
    # The host process runs as the sandbox's own host uid (a range of one uid makes it the
    # sandbox's): only the pid namespace, not credentials, can protect it from the sandbox.
    uid = random.randrange(1_990_000_000, 1_999_999_999)
    config = Config(sandbox_uid_range=f"{uid}-{uid}")
    assert isinstance(local_host, Host)
    local_executor = LocalExecutor(config, host=local_host)
    host = subprocess.Popen(
        [SANDBOX_PYTHON, "-c", "import time; time.sleep(60)", target_mark],
        user=uid, group=uid, extra_groups=[], cwd="/", start_new_session=True,
    )  # fmt: skip
    try:
        assert pids_with_argument(target_mark) == [host.pid]
        result = await run(
            local_executor,
            python(_PROCESS_SCRIPT, marker("self")),
            env={"TARGET_PID": str(host.pid), "TARGET_MARK": target_mark},
        )
        out = reported(result)
        _assert_processes_hidden(out, host.pid)
        assert len(out["pids"]) < 10, f"the sandbox sees more than its own processes: {out}"
        assert host.poll() is None, "the host process was killed"
        assert proc_status(host.pid)["State"][0] in "SR"
    finally:
        host.kill()
        host.wait()
        await local_executor.aclose()


async def test_cannot_see_or_signal_another_sandbox(local_executor: LocalExecutor) -> None:
    victim_mark = marker("victim")
    victim = ExecutionRequest(
        command=["python3", "-c", "import time; time.sleep(60)", victim_mark], timeout=30
    )
    victim_task = await start(local_executor, victim)
    try:
        (victim_pid,) = await eventually(
            lambda: named(pids_with_argument(victim_mark), "python3"),
            what="the victim sandbox's process",
        )
        # Each sandbox has a host uid of its own (so credentials separate them too), but
        # namespaces alone must hide the victim: the attack below never learns it exists.
        assert int(proc_status(victim_pid)["Uid"].split()[0]) in SANDBOX_UIDS
        result = await run(
            local_executor,
            python(_PROCESS_SCRIPT, marker("self")),
            env={"TARGET_PID": str(victim_pid), "TARGET_MARK": victim_mark},
        )
        _assert_processes_hidden(reported(result), victim_pid)
        status = await local_executor.get_status(victim.id)
        assert status.status is Status.RUNNING, status
        assert named(pids_with_argument(victim_mark), "python3") == [victim_pid]
    finally:
        await local_executor.cancel(victim.id)
        await victim_task


# -- 4, 5. network ---------------------------------------------------------------------------

_CONNECT_SCRIPT = """
import errno, os, socket, sys
port = int(os.environ["PORT"])
abstract = "\\0" + os.environ["ABSTRACT"]
out = {}
for address in sys.argv[1:]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((address, port))
        out[address] = "connected"
    except OSError as e:
        out[address] = errno.errorcode.get(e.errno, repr(e))
    s.close()
u = socket.socket(socket.AF_UNIX)
try:
    u.connect(abstract)
    out["abstract"] = "connected"
except OSError as e:
    out["abstract"] = errno.errorcode[e.errno]
# Control: the same port and the same abstract name are free in here, and loopback works.
server = socket.socket()
server.bind(("127.0.0.1", port))
server.listen()
client = socket.create_connection(("127.0.0.1", port), timeout=3)
out["own loopback"] = server.accept()[0].getsockname()[1] == port
own = socket.socket(socket.AF_UNIX)
own.bind(abstract)
out["own abstract"] = True
report(out)
"""


async def test_cannot_reach_a_service_on_the_host_loopback(local_executor: LocalExecutor) -> None:
    server = socket.socket()
    server.bind(("0.0.0.0", 0))  # every host address, loopback included
    server.listen(16)
    server.setblocking(False)
    port = server.getsockname()[1]
    abstract_name = marker("abstract")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind("\0" + abstract_name)
    unix.listen(16)
    unix.setblocking(False)
    others = sorted(a for a in host_ipv4_addresses() if not a.startswith("127."))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            server.accept()[0].close()  # control: the service answers on the host
        result = await run(
            local_executor,
            python(_CONNECT_SCRIPT, "127.0.0.1", *others),
            env={"PORT": str(port), "ABSTRACT": abstract_name},
        )
        out = reported(result)
        assert out["127.0.0.1"] == "ECONNREFUSED", out
        for address in others:
            assert out[address] == "ENETUNREACH", out
        assert out["abstract"] == "ECONNREFUSED", out
        assert out["own loopback"] is True and out["own abstract"] is True
        for listener in (server, unix):
            with pytest.raises(BlockingIOError):
                listener.accept()  # no connection ever reached the host's services
    finally:
        server.close()
        unix.close()


_NETWORK_SCRIPT = """
import errno, socket
out = {"interfaces": socket.if_nameindex()}
for family, address in ((socket.AF_INET, ("1.1.1.1", 53)), (socket.AF_INET, ("8.8.8.8", 443)),
                        (socket.AF_INET6, ("2606:4700:4700::1111", 53))):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        s = socket.socket(family, kind)
        s.settimeout(3)
        key = f"{address[0]}:{address[1]}/{'tcp' if kind == socket.SOCK_STREAM else 'udp'}"
        try:
            if kind == socket.SOCK_STREAM:
                s.connect(address)
            else:
                s.sendto(b"x", address)
            out[key] = "sent"
        except OSError as e:
            out[key] = errno.errorcode.get(e.errno, repr(e))
try:
    out["getaddrinfo"] = repr(socket.getaddrinfo("example.com", 443))
except socket.gaierror as e:
    out["getaddrinfo"] = "gaierror"
out["/proc/net/dev"] = [l.split(":")[0].strip() for l in open("/proc/net/dev") if ":" in l]
report(out)
"""


async def test_cannot_reach_any_network_or_resolve_names(local_executor: LocalExecutor) -> None:
    result = await run(local_executor, python(_NETWORK_SCRIPT))
    out = reported(result)
    assert out["interfaces"] == [[1, "lo"]], "only the loopback interface exists"
    assert out["/proc/net/dev"] == ["lo"]
    for key, value in out.items():
        if "/" in key and not key.startswith("/"):
            assert value == "ENETUNREACH", f"{key}: {value}"
    assert out["getaddrinfo"] == "gaierror"
    assert result.status is Status.SUCCEEDED


# -- 6. dangerous system calls ---------------------------------------------------------------

_SYSCALL_SCRIPT = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def arg(value):
    if value is None:
        return ctypes.c_void_p(None)
    if isinstance(value, bytes):
        return ctypes.c_char_p(value)
    return ctypes.c_long(value)
def call(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *map(arg, args))
    return result, ctypes.get_errno()
name, nr, args = sys.argv[1], int(sys.argv[2]), eval(sys.argv[3])
control = call(39)  # getpid through the same path
result, err = call(nr, *args)
if result == 0 and name.startswith("clone"):
    os._exit(0)  # the child of a clone that should not have happened
report({"control": [control[0], os.getpid()], "result": result,
        "errno": errno.errorcode.get(err, str(err))})
"""

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x20000, 0x10000000, 0x40000000, 17
AT_FDCWD = -100
# name, x86_64 number, arguments (a Python expression), expected errno
DENIED = [
    ("ptrace-traceme", 101, "[0, 0, 0, 0]", "EPERM"),
    ("ptrace-attach-pid-1", 101, "[16, 1, 0, 0]", "EPERM"),
    ("process_vm_readv", 310, "[1, None, 0, None, 0, 0]", "EPERM"),
    ("process_vm_writev", 311, "[1, None, 0, None, 0, 0]", "EPERM"),
    ("pidfd_getfd", 438, "[0, 0, 0]", "EPERM"),  # another process's descriptors
    ("kcmp", 312, "[1, 1, 0, 0, 0]", "EPERM"),  # KCMP_FILE: what another process has open
    ("mount-tmpfs", 165, "[b'none', b'/tmp', b'tmpfs', 0, None]", "EPERM"),
    ("umount2", 166, "[b'/tmp', 2]", "EPERM"),
    ("pivot_root", 155, "[b'/tmp', b'/tmp']", "EPERM"),
    ("chroot", 161, "[b'/tmp']", "EPERM"),
    ("fsopen", 430, "[b'tmpfs', 0]", "EPERM"),
    ("open_tree", 428, f"[{AT_FDCWD}, b'/tmp', 1]", "EPERM"),
    ("unshare-user", 272, f"[{CLONE_NEWUSER}]", "EPERM"),
    ("unshare-mount", 272, f"[{CLONE_NEWNS}]", "EPERM"),
    ("unshare-net", 272, f"[{CLONE_NEWNET}]", "EPERM"),
    ("clone-newuser", 56, f"[{CLONE_NEWUSER | SIGCHLD}, 0, 0, 0, 0]", "EPERM"),
    ("clone3", 435, "[None, 0]", "ENOSYS"),  # so libc falls back to the filtered clone
    ("setns", 308, "[0, 0]", "EPERM"),
    ("init_module", 175, "[None, 0, b'']", "EPERM"),
    ("finit_module", 313, "[0, b'', 0]", "EPERM"),
    ("delete_module", 176, "[b'ext4', 0]", "EPERM"),
    ("kexec_load", 246, "[0, 0, None, 0]", "EPERM"),
    ("keyctl", 250, "[0, -3, 1]", "EPERM"),  # KEYCTL_GET_KEYRING_ID, session, create
    ("add_key", 248, "[b'user', b'ringfence', b'x', 1, -2]", "EPERM"),
    ("request_key", 249, "[b'user', b'ringfence', None, -2]", "EPERM"),
    ("bpf", 321, "[5, None, 0]", "EPERM"),  # BPF_PROG_LOAD
    ("perf_event_open", 298, "[None, 0, -1, -1, 0]", "EPERM"),
    ("userfaultfd", 323, "[0]", "EPERM"),
    ("io_uring_setup", 425, "[1, None]", "EPERM"),
    ("personality", 135, "[0xffffffff]", "EPERM"),
    ("syslog", 103, "[10, None, 0]", "EPERM"),  # SYSLOG_ACTION_SIZE_BUFFER
    ("open_by_handle_at", 304, f"[{AT_FDCWD}, None, 0]", "EPERM"),
    ("clock_settime", 227, "[0, None]", "EPERM"),
    ("ioctl-TIOCSTI", 16, "[0, 0x5412, b'x']", "EPERM"),
    ("ioctl-TIOCSTI-high-bits", 16, "[0, 0x100005412, b'x']", "EPERM"),
]


@pytest.mark.parametrize(("name", "nr", "args", "expected"), DENIED, ids=[d[0] for d in DENIED])
async def test_dangerous_system_call_is_refused(
    local_executor: LocalExecutor, name: str, nr: int, args: str, expected: str
) -> None:
    result = await run(local_executor, python(_SYSCALL_SCRIPT, name, str(nr), args))
    out = reported(result)
    assert out["control"][0] == out["control"][1], "control: syscall() works (getpid)"
    assert (out["result"], out["errno"]) == (-1, expected), f"{name}: {out}"


async def test_cannot_create_a_user_namespace_with_unshare(local_executor: LocalExecutor) -> None:
    result = await run(local_executor, ["unshare", "-U", "-r", "id", "-u"])
    assert result.status is Status.FAILED
    # EPERM from the seccomp filter; ENOSPC would be bubblewrap's --disable-userns beneath it.
    assert re.search(
        r"unshare failed: (Operation not permitted|No space left on device)", result.logs
    ), result.logs
    assert "0" not in result.logs.split()


_IA32_SCRIPT = """
import ctypes, mmap, sys
nr, arg = int(sys.argv[1]), int(sys.argv[2])
# push rbx; mov eax, nr; mov ebx, arg; int 0x80; pop rbx; ret
code = (b"\\x53\\xb8" + nr.to_bytes(4, "little") + b"\\xbb" + arg.to_bytes(4, "little")
        + b"\\xcd\\x80\\x5b\\xc3")
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
entry = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
print("ia32 system call returned", entry(), flush=True)
"""


async def test_cannot_bypass_the_filter_with_32_bit_system_calls(
    local_executor: LocalExecutor,
) -> None:
    # i386 numbers differ from x86_64 ones (ptrace is 26, personality 136): a filter that
    # ignored the architecture would let these through.
    host = subprocess.run(
        [SANDBOX_PYTHON, "-c", _IA32_SCRIPT, "20", "0"], capture_output=True, text=True
    )  # getpid: the control, on the host
    has_ia32 = host.returncode == 0
    if not has_ia32:  # a kernel without 32-bit emulation: the entry point segfaults
        assert host.returncode == -signal.SIGSEGV, host
    for nr, argument in ((26, 0), (136, 0xFFFFFFFF), (20, 0)):  # ptrace, personality, getpid
        result = await run(local_executor, python(_IA32_SCRIPT, str(nr), str(argument)))
        assert "returned" not in result.logs, result.logs
        assert result.status is Status.FAILED
        # bwrap's init passes a death by signal on as the exit status 128 + the signal.
        expected = signal.SIGSYS if has_ia32 else signal.SIGSEGV
        assert result.exit_code == 128 + expected, result
        assert result.error in (None, f"killed by signal {expected.name}"), result


# -- 7, 8, 9. resources ----------------------------------------------------------------------


async def test_a_fork_bomb_is_contained(local_executor: LocalExecutor) -> None:
    bomb_mark = marker("fork-bomb")
    pids_max = 64
    # The top-level shell keeps spinning (a builtin loop, no fork) so the bomb keeps going.
    request = ExecutionRequest(
        command=["bash", "-c", "f() { f | f & }; f; while :; do :; done", bomb_mark],
        limits=ResourceLimits(pids=pids_max),
        timeout=3,
    )
    task = await start(local_executor, request)
    dirs = await eventually(lambda: cgroup_dirs(request.id), what="the sandbox's cgroup")
    pids_dir = pids_cgroup_dir(dirs)
    assert int((pids_dir / "pids.max").read_text()) == pids_max
    peak = refused = 0
    while not task.done():
        try:
            peak = max(peak, int((pids_dir / "pids.current").read_text()))
            refused = read_counter(pids_dir / "pids.events", "max")
        except FileNotFoundError:
            break
        await asyncio.sleep(0.005)
    result = await task
    assert result.status is Status.TIMED_OUT, result
    assert peak <= pids_max
    assert refused > 0, "the bomb never reached the pids limit (so it tested nothing)"
    assert "Resource temporarily unavailable" in result.logs
    # Nothing of it remains, and the host still works.
    assert pids_with_argument(bomb_mark) == []
    assert [d for d in dirs if d.exists()] == []
    began = time.monotonic()
    fresh = await run(local_executor, ["echo", "still works"])
    assert fresh.status is Status.SUCCEEDED and fresh.logs == "still works\n"
    assert time.monotonic() - began < 5


async def test_a_memory_hog_is_killed_as_out_of_memory(local_executor: LocalExecutor) -> None:
    script = """
        chunks = []
        for i in range(1, 33):
            chunks.append(b"x" * (16 << 20))  # touched, not lazily zeroed
            print("allocated", 16 * i, "MiB", flush=True)
        print("allocated everything")
    """
    result = await run(local_executor, python(script), limits=ResourceLimits(memory="64M"))
    assert result.status is Status.FAILED
    assert result.error == "out of memory"
    assert "allocated 16 MiB" in result.logs, "control: the hog ran"
    assert "allocated 64 MiB" not in result.logs
    assert "allocated everything" not in result.logs


_CPU_SCRIPT = """
import os, time
end = time.monotonic() + 1.0
children = []
for _ in range(2):  # as many busy processes as this machine has cores, or more
    pid = os.fork()
    if pid == 0:
        while time.monotonic() < end:
            pass
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
times = os.times()
report({"cpu seconds": times.children_user + times.children_system})
"""


async def test_a_cpu_hog_gets_no_more_than_its_share(local_executor: LocalExecutor) -> None:
    result = await run(local_executor, python(_CPU_SCRIPT), limits=ResourceLimits(cpus=0.25))
    used = reported(result)["cpu seconds"]
    assert used >= 0.05, "control: the busy loops ran"
    assert used <= 0.45, f"two busy processes used {used} s of CPU in 1 s with cpus=0.25"


_FILL_SCRIPT = """
import errno, os, sys
path, chunk, written = sys.argv[1], b"x" * (1 << 20), 0
try:
    with open(path, "wb", buffering=0) as f:
        while written < (64 << 20):
            written += f.write(chunk)
            os.fsync(f.fileno())
    outcome = "no error"
except OSError as e:
    outcome = errno.errorcode[e.errno]
report({"outcome": outcome, "written": written, "size": os.stat(path).st_size})
"""


@pytest.mark.parametrize("directory", ["/tmp", "/home/user", "/dev/shm"])
@_AS_THE_USER_ONLY
async def test_filling_a_writable_directory_is_bounded(
    local_executor: LocalExecutor, directory: str
) -> None:
    disk = 8 * MiB
    result = await run(
        local_executor,
        python(_FILL_SCRIPT, f"{directory}/fill"),
        limits=ResourceLimits(disk=disk),
    )
    out = reported(result)
    assert out["outcome"] == "ENOSPC", out
    assert out["size"] <= disk
    assert out["size"] >= disk - MiB, f"control: the filler wrote up to the limit: {out}"


@_AS_THE_USER_ONLY
async def test_dd_filling_tmp_gets_no_space_left(local_executor: LocalExecutor) -> None:
    result = await run(
        local_executor,
        ["sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=64; stat -c 'size=%s' /tmp/fill"],
        limits=ResourceLimits(disk="8M"),
    )
    assert "dd: error writing '/tmp/fill': No space left on device" in result.logs
    size = int(result.logs.split("size=")[1].split()[0])
    assert 7 * MiB <= size <= 8 * MiB, result.logs


async def test_files_do_not_persist_from_one_sandbox_to_the_next(
    local_executor: LocalExecutor,
) -> None:
    name = marker("left-behind")
    first = await run(local_executor, ["sh", "-c", f"touch /tmp/{name} /home/user/{name} "
                                                     f"/dev/shm/{name} && ls /tmp"])  # fmt: skip
    assert first.status is Status.SUCCEEDED and name in first.logs, "control"
    second = await run(local_executor, ["sh", "-c", "ls -A /tmp /home/user /dev/shm"])
    assert second.status is Status.SUCCEEDED
    assert name not in second.logs


# -- 10. outliving the deadline --------------------------------------------------------------

_DAEMON_SCRIPT = """
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        print("daemon", os.getpid(), "detached", flush=True)
        time.sleep(60)
        os._exit(0)
    os._exit(0)
os.wait()
if sys.argv[2] == "linger":
    time.sleep(60)
print("parent leaves", flush=True)
"""


async def _daemon_until_visible(
    executor: LocalExecutor, request: ExecutionRequest, mark: str
) -> tuple[asyncio.Task[ExecutionResult], list[Path]]:
    task = await start(executor, request)
    # Control: the detached daemon (and its parent) are visible from the host by marker.
    await eventually(
        lambda: len(named(pids_with_argument(mark), "python3")) == 2,
        what="the daemon to detach",
    )
    dirs = cgroup_dirs(request.id)
    assert dirs, "control: the sandbox's cgroup exists while it runs"
    assert set(named(pids_with_argument(mark), "python3")) <= cgroup_procs(dirs)
    return task, dirs


async def test_a_detached_process_does_not_outlive_the_timeout(
    local_executor: LocalExecutor,
) -> None:
    mark = marker("daemon")
    request = ExecutionRequest(command=python(_DAEMON_SCRIPT, mark, "linger"), timeout=1.5)
    task, dirs = await _daemon_until_visible(local_executor, request, mark)
    result = await task
    assert result.status is Status.TIMED_OUT
    assert "detached" in result.logs
    assert pids_with_argument(mark) == []
    assert [d for d in dirs if d.exists()] == []


async def test_a_detached_process_does_not_outlive_a_cancel(local_executor: LocalExecutor) -> None:
    mark = marker("daemon")
    request = ExecutionRequest(command=python(_DAEMON_SCRIPT, mark, "linger"), timeout=30)
    task, dirs = await _daemon_until_visible(local_executor, request, mark)
    cancelled = await local_executor.cancel(request.id)
    assert cancelled.status is Status.CANCELLED
    assert pids_with_argument(mark) == []
    assert [d for d in dirs if d.exists()] == []
    assert (await task).status is Status.CANCELLED


async def test_a_detached_process_does_not_outlive_a_command_that_succeeded(
    local_executor: LocalExecutor,
) -> None:
    mark = marker("daemon")
    request = ExecutionRequest(command=python(_DAEMON_SCRIPT, mark, "leave"), timeout=8)
    result = await local_executor.execute(request)
    assert result.status is Status.SUCCEEDED
    assert "detached" in result.logs and "parent leaves" in result.logs, "control"
    assert pids_with_argument(mark) == []
    assert cgroup_dirs(request.id) == []


_SUPERVISOR = """
import asyncio, sys
from ringfence.config import Config
from ringfence.backends.local import LocalExecutor
from ringfence.models import ExecutionRequest
async def main():
    executor = LocalExecutor(Config())
    request = ExecutionRequest(id=sys.argv[1], command=sys.argv[2:], timeout=60)
    await executor.execute(request)
asyncio.run(main())
"""


async def test_a_sandbox_does_not_outlive_its_supervisor() -> None:
    mark = marker("orphan")
    execution_id = uuid.uuid4().hex
    supervisor = subprocess.Popen(
        [sys.executable, "-c", _SUPERVISOR, execution_id, "sh", "-c", "sleep 60; :", mark]
    )
    try:
        await eventually(
            lambda: named(pids_with_argument(mark), "sh"), timeout=10, what="the sandbox"
        )
        supervisor.kill()  # a crash: no chance to clean up
        supervisor.wait()
        await eventually(
            lambda: not pids_with_argument(mark), timeout=5, what="the sandbox to die with it"
        )
    finally:
        supervisor.kill()
        supervisor.wait()
        # Its cgroups stay behind, empty, for the next Ringfence start to sweep: tidy them.
        for directory in cgroup_dirs(execution_id):
            with contextlib.suppress(OSError):
                directory.rmdir()
                directory.parent.rmdir()


# -- 11. output flood ------------------------------------------------------------------------


async def test_an_output_flood_is_truncated_in_bounded_memory(
    local_executor: LocalExecutor,
) -> None:
    limit = local_executor.config.max_log_bytes
    flood = 200 * MiB
    script = """
        import sys
        out = sys.stdout.buffer
        out.write(b"BEGIN\\n")
        block = b"x" * (1 << 20)
        for _ in range(200):
            out.write(block)
        out.write(b"\\nEND\\n")
    """
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: the peak starts from here
    rss_before = vm_kib("VmRSS")
    result = await run(local_executor, python(script), timeout=9)
    peak_growth = (vm_kib("VmHWM") - rss_before) << 10
    assert result.status is Status.SUCCEEDED
    assert result.logs_truncated is True
    assert result.logs.startswith("BEGIN\n") and result.logs.endswith("\nEND\n")
    match = TRUNCATION_MARKER.search(result.logs)
    assert match is not None
    total = len(b"BEGIN\n") + flood + len(b"\nEND\n")
    assert int(match.group(1)) == total - limit, "the marker counts exactly what was cut"
    assert len(result.logs.encode()) <= limit + 100
    assert peak_growth < 64 * MiB, f"the supervisor's memory grew by {peak_growth >> 20} MiB"


# -- 12. the sandbox's own policy ------------------------------------------------------------

_PROC_SYS_SCRIPT = """
import errno, sys
out = {}
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("1\\n")
        out[path] = "ok"
    except OSError as e:
        out[path] = errno.errorcode[e.errno]
try:
    out["read"] = open("/proc/sys/kernel/hostname").read().strip()
except OSError as e:
    out["read"] = errno.errorcode[e.errno]
report(out)
"""


async def test_cannot_change_kernel_settings_through_proc(local_executor: LocalExecutor) -> None:
    targets = [
        "/proc/sys/kernel/hostname",
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/kernel/modprobe",
        "/proc/sys/user/max_user_namespaces",  # --disable-userns set it in here
        "/proc/sys/vm/drop_caches",
        "/proc/sys/net/ipv4/ip_forward",
        "/proc/sysrq-trigger",
        "/proc/self/setgroups",
        "/proc/self/uid_map",
        "/proc/1/uid_map",
    ]
    before = {p: Path(p).read_text() for p in targets[:6] if os.access(p, os.R_OK)}
    result = await run(local_executor, python(_PROC_SYS_SCRIPT, *targets))
    out = reported(result)
    assert out["read"] == "sandbox", "control: /proc/sys is there and readable"
    for path in targets:
        assert out[path] in ("EACCES", "EPERM", "EROFS", "ENOENT"), f"{path}: {out[path]}"
    assert {p: Path(p).read_text() for p in before} == before


_SYS_SCRIPT = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
out = {p: os.path.exists(p) for p in ("/sys", "/sys/fs/cgroup", "/run", "/run/ringfence")}
out["cgroup view"] = open("/proc/self/cgroup").read()
os.mkdir("/tmp/target")
for fstype, data in ((b"cgroup2", None), (b"cgroup", b"pids"), (b"sysfs", None),
                     (b"proc", None), (b"tmpfs", None)):
    r = libc.mount(b"none", b"/tmp/target", fstype, 0, data)
    out["mount " + fstype.decode()] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
r = libc.mount(None, b"/", None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND, without MS_RDONLY
out["remount / rw"] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
report(out)
"""


async def test_cannot_reach_sys_the_cgroup_files_or_the_runtime_dir(
    local_executor: LocalExecutor,
) -> None:
    result = await run(local_executor, python(_SYS_SCRIPT))
    out = reported(result)
    for path in ("/sys", "/sys/fs/cgroup", "/run", "/run/ringfence"):
        assert out[path] is False, f"{path} is visible in the sandbox"
    for fstype in ("cgroup2", "cgroup", "sysfs", "proc", "tmpfs"):
        assert out[f"mount {fstype}"] == "EPERM", out
    assert out["remount / rw"] == "EPERM", out


def _runtime_files(runtime_dir: Path) -> dict[Path, str]:
    """The files sandboxes share from the runtime directory; not the live sandboxes'
    volumes (each its own, mounted there, with a view of the template)."""
    files = {}
    for root, dirs, names in os.walk(runtime_dir):
        if Path(root) == runtime_dir:
            dirs[:] = [d for d in dirs if d != VOLUMES]
        for name in names:
            path = Path(root, name)
            if path.is_file() and not path.is_symlink():
                files[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


@_AS_THE_USER_ONLY
async def test_cannot_rewrite_the_generated_etc_files(local_executor: LocalExecutor) -> None:
    runtime_dir = local_executor.config.runtime_dir
    before = _runtime_files(runtime_dir)
    assert any(p.name == "passwd" for p in before), "control: the runtime dir holds the files"
    targets = []
    for name in GENERATED_ETC:
        targets += [f"a:/etc/{name}", f"w:/etc/{name}", f"unlink:/etc/{name}"]
    created = ["w:/etc/shadow", "w:/etc/ld.so.preload", "w:/etc/resolv.conf"]
    result = await run(
        local_executor,
        ["sh", "-c", 'cat /etc/passwd && exec python3 -c "$0" "$@"', python(_WRITE_SCRIPT)[2],
         *targets, *created],
    )  # fmt: skip
    out = reported(result)
    assert result.logs.startswith(GENERATED_ETC["passwd"]), "control: the generated passwd"
    for target in [*targets, *created]:
        assert out[target] in ("EROFS", "EACCES"), f"{target}: {out[target]}"
    after = _runtime_files(runtime_dir)
    assert {p: h for p, h in after.items() if p in before} == {
        p: h for p, h in before.items() if p in after
    }, "a runtime file changed"
    for path in after:
        assert path.name not in ("shadow", "ld.so.preload", "resolv.conf"), path


_SECCOMP_SCRIPT = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def status():
    fields = dict(l.split(":", 1) for l in open("/proc/self/status"))
    return {k: fields[k].strip() for k in ("Seccomp", "NoNewPrivs")}
out = {"before": status()}
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_GET_SECCOMP = 22, 38, 21
for name, args in (("seccomp off", (PR_SET_SECCOMP, 0, 0, 0, 0)),
                   ("no_new_privs off", (PR_SET_NO_NEW_PRIVS, 0, 0, 0, 0))):
    r = libc.prctl(*args)
    out[name] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
out["PR_GET_SECCOMP"] = libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0)
out["after"] = status()
report(out)
"""


async def test_cannot_turn_off_its_seccomp_filter(local_executor: LocalExecutor) -> None:
    result = await run(local_executor, python(_SECCOMP_SCRIPT))
    out = reported(result)
    assert out["before"] == {"Seccomp": "2", "NoNewPrivs": "1"}
    assert out["seccomp off"] == "EINVAL" and out["no_new_privs off"] == "EINVAL", out
    assert out["PR_GET_SECCOMP"] == 2
    assert out["after"] == out["before"]


_CREDENTIALS_SCRIPT = """
import os
def status(pid):
    fields = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status"))
    return {k: fields[k].strip() for k in fields
            if k.startswith("Cap") or k in ("NoNewPrivs", "Seccomp", "Uid", "Gid", "Name")}
report({"self": status("self"), "init": status(1), "uid": os.getuid(),
        "groups": os.getgroups()})
"""


@_AS_THE_USER_ONLY
async def test_sandboxed_processes_have_no_capabilities_no_new_privs_and_seccomp(
    local_executor: LocalExecutor,
) -> None:
    result = await run(local_executor, python(_CREDENTIALS_SCRIPT))
    out = reported(result)
    assert out["uid"] == 1000 and set(out["groups"]) <= {1000}
    assert out["init"]["Name"] == "bwrap", "control: pid 1 is the sandbox's init"
    for who in ("self", "init"):
        status = out[who]
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status[cap], 16) == 0, f"{who} {cap}={status[cap]}"
        assert status["NoNewPrivs"] == "1", who
        assert status["Seccomp"] == "2", who
        assert status["Uid"].split() == ["1000"] * 4, who


# -- 13. the host's environment and descriptors ----------------------------------------------


async def test_cannot_read_the_hosts_environment(
    local_executor: LocalExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "RINGFENCE_ATTACK_CANARY_" + uuid.uuid4().hex[:8].upper()
    value = marker("env-value")
    monkeypatch.setenv(name, value)
    result = await run(
        local_executor,
        ["sh", "-c", "env; echo ---; tr '\\0' '\\n' < /proc/1/environ"],
        env={"GRANTED_VARIABLE": "granted-value"},
    )
    assert result.status is Status.SUCCEEDED
    shown, _, init_environ = result.logs.partition("---\n")
    assert "GRANTED_VARIABLE=granted-value" in shown, "control: env is shown"
    # bwrap (pid 1 inside) was started with an empty environment: the request's variables
    # are set by bwrap for the command only.
    assert init_environ.strip() == ""
    assert name not in result.logs and value not in result.logs
    for host_only in ("PYTEST_CURRENT_TEST", "VIRTUAL_ENV"):
        assert host_only not in result.logs


@_AS_THE_USER_ONLY
async def test_cannot_use_the_hosts_open_file_descriptors(
    local_executor: LocalExecutor, world_dir: Path
) -> None:
    canary = world_file(world_dir / marker("fd-canary"), "secret")
    fd = os.open(canary, os.O_RDONLY)
    read_end, write_end = os.pipe()
    sock = socket.socket()
    try:
        for inheritable in (fd, read_end, write_end, sock.fileno()):
            os.set_inheritable(inheritable, True)
        result = await run(
            local_executor, ["sh", "-c", "ls -l /proc/self/fd; echo ---; ls /proc/1/fd"]
        )
        assert result.status is Status.SUCCEEDED
        own, init = result.logs.split("---\n")
        entries = [line.split() for line in own.splitlines() if "->" in line]
        numbers = sorted(int(words[-3]) for words in entries)
        assert numbers == [0, 1, 2, 3], own
        assert entries[-1][-1].endswith("/fd"), "fd 3 is ls's own directory descriptor"
        assert canary.name not in result.logs
        assert str(fd) not in init.split(), init
    finally:
        os.close(fd)
        os.close(read_end)
        os.close(write_end)
        sock.close()


# -- the request's environment outside the sandbox -------------------------------------------


async def test_the_request_environment_does_not_reach_processes_outside_the_sandbox(
    local_executor: LocalExecutor,
) -> None:
    # The dynamic loader writes its debug log wherever LD_DEBUG_OUTPUT says, as whoever runs
    # the program. The same path exists inside the sandbox (in its own /tmp) and on the host
    # (a directory anyone may write): a log on the host means that a process outside the
    # sandbox (the launcher as root, or bwrap before it enters its namespaces) ran with the
    # request's environment, which is the sandboxed command's alone.
    host_dir = Path(tempfile.mkdtemp(prefix="ringfence-ld-"))
    try:
        host_dir.chmod(0o777)
        result = await run(
            local_executor,
            ["sh", "-c", f"mkdir -p {host_dir} && env true && ls {host_dir}"],
            env={"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": f"{host_dir}/ld-debug"},
        )
        assert result.status is Status.SUCCEEDED, result
        assert "ld-debug." in result.logs, "control: the variables apply inside the sandbox"
        leaked = {p.name: p.read_text()[:300] for p in host_dir.iterdir()}
        assert leaked == {}, f"a process outside the sandbox used the request's env: {leaked}"
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


_PRELOAD_SOURCE = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void run_at_load(void) {
    char path[4096], exe[256] = "";
    readlink("/proc/self/exe", exe, sizeof exe - 1);
    snprintf(path, sizeof path, "%s/loaded-by-uid-%d-pid-%d", PROOF_DIR, getuid(), getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) { dprintf(fd, "%s\n", exe); close(fd); }
}
"""


@_AS_THE_USER_ONLY
async def test_a_library_built_in_the_sandbox_is_never_loaded_outside_it(
    local_executor: LocalExecutor, world_dir: Path
) -> None:
    # A project directory granted writable at the same path inside and out (a common set-up),
    # and an environment that preloads a library from it. The sandboxed command writes that
    # library; the next execution must load it inside the sandbox only.
    project = world_dir / "project"
    project.mkdir()
    project.chmod(0o777)
    mounts = [Mount(source=str(project), target=str(project), writable=True)]
    source = _PRELOAD_SOURCE.replace("PROOF_DIR", json.dumps(str(project)))
    build = await run(
        local_executor,
        ["sh", "-c", 'cd "$1" && printf "%s" "$0" > lib.c && gcc -shared -fPIC -o lib.so lib.c',
         source, str(project)],
        mounts=mounts, timeout=9,
    )  # fmt: skip
    assert build.status is Status.SUCCEEDED, f"control: the sandbox builds a library: {build}"
    result = await run(
        local_executor, ["env", "true"], env={"LD_PRELOAD": f"{project}/lib.so"}, mounts=mounts
    )
    assert result.status is Status.SUCCEEDED, result
    loaded = {p.name: p.read_text().strip() for p in project.glob("loaded-by-*")}
    inside = {name: exe for name, exe in loaded.items() if name.startswith("loaded-by-uid-1000-")}
    assert inside, f"control: the library is loaded in the sandbox: {loaded}"
    outside = {name: exe for name, exe in loaded.items() if name not in inside}
    assert outside == {}, f"loaded outside the sandbox (uid 0 is host root): {outside}"


# -- 14. the host uid behind the sandbox -----------------------------------------------------


async def test_no_sandbox_process_runs_as_host_root(local_executor: LocalExecutor) -> None:
    mark = marker("sleeper")
    request = ExecutionRequest(command=["sh", "-c", "sleep 30; :", mark], timeout=20)
    task = await start(local_executor, request)
    try:
        await eventually(lambda: pids_with_argument(mark), what="the sandboxed shell")
        dirs = cgroup_dirs(request.id)
        procs = await eventually(
            lambda: cgroup_procs(dirs) if len(cgroup_procs(dirs)) >= 3 else None,
            what="init, shell and sleep in the sandbox's cgroup",
        )
        inits = [p for p in procs if int(proc_status(p)["PPid"]) not in procs]
        assert len(inits) == 1, f"one sandbox init expected among {procs}"
        outer = int(proc_status(inits[0])["PPid"])
        # Every process with the marker (bwrap has it among its arguments) is accounted for.
        assert set(pids_with_argument(mark)) <= procs | {outer}
        assert proc_status(outer)["Name"] == "bwrap", "control: the parent is bwrap"
        uid = int(proc_status(outer)["Uid"].split()[0])
        assert uid in SANDBOX_UIDS, "a host uid of the sandbox range"
        for pid in [*procs, outer]:
            status = proc_status(pid)
            assert os.stat(f"/proc/{pid}").st_uid != 0, f"pid {pid} ({status['Name']})"
            assert status["Uid"].split() == [str(uid)] * 4, (pid, status["Uid"])
            assert status["Gid"].split() == [str(uid)] * 4, (pid, status["Gid"])
            assert status["Groups"] == "", (pid, status["Groups"])
        # The outer bwrap is in the host's user namespace: its capabilities are real ones.
        assert int(proc_status(outer)["CapEff"], 16) == 0
        assert int(proc_status(outer)["CapPrm"], 16) == 0
    finally:
        await local_executor.cancel(request.id)
        await task
