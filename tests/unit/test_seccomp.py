import json
import platform
import socket
import subprocess
import sys

import pytest

from ringfence.policy.seccomp import ALLOWED_SOCKET_FAMILIES, DENIED_SYSCALLS, compile_filter


def test_the_deny_list_covers_the_threat_model() -> None:
    for name in (
        "ptrace",
        "mount",
        "unshare",
        "setns",
        "init_module",
        "finit_module",
        "kexec_load",
        "bpf",
        "keyctl",
        "add_key",
        "perf_event_open",
        "userfaultfd",
        "open_by_handle_at",
        "io_uring_setup",
        "pivot_root",
        "chroot",
    ):
        assert name in DENIED_SYSCALLS


def test_the_filter_compiles_to_a_bpf_program_once() -> None:
    program = compile_filter()
    assert len(program) % 8 == 0 and len(program) > 8 * len(DENIED_SYSCALLS)
    assert compile_filter() is program


def test_ptrace_equivalents_are_denied() -> None:
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp"):
        assert name in DENIED_SYSCALLS


def test_only_unix_inet_inet6_and_netlink_sockets_are_allowed() -> None:
    assert ALLOWED_SOCKET_FAMILIES == {
        socket.AF_UNIX: "AF_UNIX",
        socket.AF_INET: "AF_INET",
        socket.AF_INET6: "AF_INET6",
        socket.AF_NETLINK: "AF_NETLINK",
    }


# Loads the compiled program into a child process the way bwrap does (no_new_privs, then
# SECCOMP_SET_MODE_FILTER): no privileges needed. Prints what each call answered.
_UNDER_THE_FILTER = """
import ctypes, errno, json, os, socket, sys
program = sys.stdin.buffer.read()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
fprog = Fprog(len(program) // 8, program)
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
def outcome(make):
    try:
        made = make()
    except OSError as e:
        return errno.errorcode[e.errno]
    for s in made if isinstance(made, tuple) else (made,):
        s.close()
    return "ok"
def raw(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps({
    "unix": outcome(lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)),
    "inet": outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)),
    "inet6": outcome(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)),
    "netlink": outcome(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
    "vsock": outcome(lambda: socket.socket(40, socket.SOCK_STREAM)),
    "packet": outcome(lambda: socket.socket(17, socket.SOCK_RAW)),
    "alg": outcome(lambda: socket.socket(38, socket.SOCK_SEQPACKET)),
    "unspec": outcome(lambda: socket.socket(0, socket.SOCK_STREAM)),
    "above every family": outcome(lambda: socket.socket(1000, socket.SOCK_STREAM)),
    "vsock pair": outcome(lambda: socket.socketpair(40, socket.SOCK_STREAM)),
    "inet with upper bits": raw(41, 2 | (1 << 32), socket.SOCK_DGRAM, 0),
    "pidfd_getfd": raw(438, 0, 0, 0),
    "kcmp": raw(312, os.getpid(), os.getpid(), 0, 0, 0),
}))
"""


@pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the raw system call numbers are x86_64's"
)
def test_the_compiled_filter_refuses_what_it_says() -> None:
    ran = subprocess.run(
        [sys.executable, "-I", "-c", _UNDER_THE_FILTER],
        input=compile_filter(),
        capture_output=True,
        check=True,
    )
    assert json.loads(ran.stdout) == {
        "unix": "ok",
        "inet": "ok",
        "inet6": "ok",
        "netlink": "ok",
        "vsock": "EAFNOSUPPORT",
        "packet": "EAFNOSUPPORT",
        "alg": "EAFNOSUPPORT",
        "unspec": "EAFNOSUPPORT",
        "above every family": "EAFNOSUPPORT",
        "vsock pair": "EAFNOSUPPORT",
        "inet with upper bits": "EAFNOSUPPORT",
        "pidfd_getfd": "EPERM",
        "kcmp": "EPERM",
    }
