"""The seccomp filter of sandboxed processes, generated with libseccomp's bindings.

Default allow, with a deny list of the system calls that reach kernel attack surface a
sandboxed command has no business with. Denied calls fail with EPERM (so programs report a
clear error instead of dying); ``clone3`` fails with ENOSYS so that libc falls back to
``clone``, whose flags a classic BPF filter can inspect. A system call of a foreign
architecture (the 32-bit entry points on x86_64, which the deny list does not cover) kills
the whole process.

Socket address families are an allow list: ``socket`` and ``socketpair`` work for
``ALLOWED_SOCKET_FAMILIES`` only and fail with EAFNOSUPPORT (what a kernel without the
family answers) for every other one. Some families are not network-namespaced at all
(``AF_VSOCK`` reaches the hypervisor of a VM host, past the empty network namespace and the
egress proxy); the rest are attack surface nothing in a sandbox needs. The family is compared
as the whole 64-bit register, so a value with upper bits set (which the kernel truncates to
an int) is refused too.
"""

from __future__ import annotations

import errno
import functools
import tempfile

__all__ = ["ALLOWED_SOCKET_FAMILIES", "DENIED_SYSCALLS", "compile_filter"]

# unix: local IPC (the daemon, pip, git); inet/inet6: loopback and the egress proxy;
# netlink: getaddrinfo's and ip's view of the sandbox's own interfaces.
ALLOWED_SOCKET_FAMILIES: dict[int, str] = {
    1: "AF_UNIX",
    2: "AF_INET",
    10: "AF_INET6",
    16: "AF_NETLINK",
}

DENIED_SYSCALLS: dict[str, str] = {
    # debugging other processes, including the sandbox's own init (which it could hang)
    "ptrace": "debug another process",
    "process_vm_readv": "read another process's memory",
    "process_vm_writev": "write another process's memory",
    # ptrace's equivalents: take another process's descriptors (the daemon's listening
    # socket and its live connections), compare them to learn what it has open
    "pidfd_getfd": "copy another process's file descriptor",
    "kcmp": "compare the kernel objects of two processes",
    # the filesystem layout is the policy: no changing it from inside
    "mount": "mount a filesystem",
    "umount2": "unmount a filesystem",
    "pivot_root": "change the root filesystem",
    "chroot": "change the root directory",
    "fsopen": "new mount API",
    "fsconfig": "new mount API",
    "fsmount": "new mount API",
    "fspick": "new mount API",
    "move_mount": "new mount API",
    "open_tree": "new mount API",
    "mount_setattr": "new mount API",
    # namespaces: no nested sandboxes to hide in
    "unshare": "create namespaces",
    "setns": "join namespaces",
    # the kernel itself
    "init_module": "load a kernel module",
    "finit_module": "load a kernel module",
    "delete_module": "unload a kernel module",
    "kexec_load": "replace the kernel",
    "kexec_file_load": "replace the kernel",
    "reboot": "reboot",
    "bpf": "load eBPF programs",
    "perf_event_open": "performance monitoring (a classic exploit surface)",
    "userfaultfd": "userfaultfd (used to win kernel races)",
    "keyctl": "kernel keyrings (not namespaced)",
    "add_key": "kernel keyrings (not namespaced)",
    "request_key": "kernel keyrings (not namespaced)",
    "io_uring_setup": "io_uring (a large, often exploited surface)",
    "io_uring_enter": "io_uring",
    "io_uring_register": "io_uring",
    "lookup_dcookie": "kernel profiling",
    "syslog": "read the kernel log",
    "acct": "process accounting",
    "quotactl": "filesystem quotas",
    "swapon": "swap",
    "swapoff": "swap",
    "iopl": "raw I/O ports",
    "ioperm": "raw I/O ports",
    "open_by_handle_at": "open files by handle (a known container escape)",
    "name_to_handle_at": "file handles",
    "settimeofday": "set the host clock",
    "clock_settime": "set the host clock",
    "clock_adjtime": "set the host clock",
    "adjtimex": "set the host clock",
    "vhangup": "hang up the terminal",
    "nfsservctl": "kernel NFS server",
    "uselib": "obsolete loader",
    "personality": "execution domains (can disable ASLR)",
}

_CLONE_NEWUSER = 0x10000000
_TIOCSTI = 0x5412  # push characters into a terminal's input


@functools.cache
def compile_filter() -> bytes:
    """Return the filter as a BPF program, the format bubblewrap's ``--seccomp`` reads.

    Compiled once per process (about 10 ms) and reused.

    Raises:
        OSError: libseccomp is missing or refused the filter.
    """
    import pyseccomp as seccomp

    denied = seccomp.ERRNO(errno.EPERM)
    sf = seccomp.SyscallFilter(seccomp.ALLOW)
    sf.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    for name in DENIED_SYSCALLS:
        sf.add_rule(denied, name)
    sf.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    sf.add_rule(denied, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, _CLONE_NEWUSER, _CLONE_NEWUSER))
    sf.add_rule(denied, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, _TIOCSTI))
    no_family = seccomp.ERRNO(errno.EAFNOSUPPORT)
    for call in ("socket", "socketpair"):
        for family in _refused_families():
            sf.add_rule(no_family, call, seccomp.Arg(0, seccomp.EQ, family))
        sf.add_rule(no_family, call, seccomp.Arg(0, seccomp.GT, max(ALLOWED_SOCKET_FAMILIES)))
    with tempfile.TemporaryFile() as out:
        sf.export_bpf(out)
        out.seek(0)
        return out.read()


def _refused_families() -> list[int]:
    """The families below the highest allowed one that are not allowed (those above it are
    refused by one comparison)."""
    return [f for f in range(max(ALLOWED_SOCKET_FAMILIES)) if f not in ALLOWED_SOCKET_FAMILIES]
