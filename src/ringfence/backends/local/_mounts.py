"""The mount system calls the sandbox volumes need (root only), through libc.

``mount``/``umount2`` for the volume's tmpfs; ``open_tree`` + ``mount_setattr`` +
``move_mount`` for an idmapped, read-only view of a template directory (the lower layer of
an overlay: files of host uid 0 appear as the sandbox's own root uid, so its root may
change them, copied up into its own upper layer); a user namespace whose only purpose is to
carry that id mapping. Linux x86_64 and aarch64.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import subprocess
import time

__all__ = [
    "idmapped_view",
    "mount_tmpfs",
    "mounts_under",
    "unmount",
    "userns_mapping",
    "userns_mappings",
]

_libc = ctypes.CDLL(None, use_errno=True)

_SYSCALLS = {  # open_tree, move_mount, mount_setattr
    "x86_64": (428, 429, 442),
    "aarch64": (428, 429, 442),
}
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MNT_DETACH = 0x2
_USERNS_SECONDS = 5.0


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def mount_tmpfs(target: str, size: int, mode: int, gid: int, inodes: int | None = None) -> None:
    """Mount a tmpfs of ``size`` bytes at ``target`` (nosuid, nodev), its root owned by
    root and group ``gid`` with ``mode``; at most ``inodes`` inodes (hard links count:
    tmpfs reserves one per link) when given, else the kernel's default (half of RAM in
    pages, which ``size`` does not bound). Raises ``OSError``."""
    options = f"size={size},mode={mode:o},uid=0,gid={gid}"
    if inodes is not None:
        options += f",nr_inodes={inodes}"
    flags = _MS_NOSUID | _MS_NODEV
    _check(
        _libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, options.encode()),
        f"mount {target}",
    )


def unmount(target: str) -> None:
    """Detach the mount at ``target`` and every mount under it. Raises ``OSError``."""
    _check(_libc.umount2(target.encode(), _MNT_DETACH), f"umount {target}")


def mounts_under(prefix: str) -> list[str]:
    """Mount points at or under ``prefix`` in our mount namespace, deepest first."""
    found = []
    with open("/proc/self/mountinfo") as table:
        for line in table:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix.rstrip("/") + "/"):
                found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def userns_mapping(host_uid: int) -> int:
    """A descriptor of a new user namespace that maps id 0 to ``host_uid`` (uid and gid),
    and nothing else: what an idmapped view is made with. A helper process enters it and is
    gone before this returns; the descriptor keeps the namespace.

    Raises:
        OSError: the namespace cannot be made (the message says why).
    """
    return userns_mappings({0: host_uid})


def userns_mappings(ids: dict[int, int], gids: dict[int, int] | None = None) -> int:
    """``userns_mapping`` for several ids: each key (as the filesystem stores it) to its
    host id (uid and gid the same numbers, unless ``gids`` maps the gids apart), and
    nothing else.

    Raises:
        OSError: the namespace cannot be made (the message says why).
    """
    helper = subprocess.Popen(
        ["unshare", "--user", "sleep", "60"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={},
    )  # fmt: skip
    try:
        ours = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + _USERNS_SECONDS
        while os.readlink(f"/proc/{helper.pid}/ns/user") == ours:  # until it has unshared
            if helper.poll() is not None or time.monotonic() > deadline:
                err = helper.stderr.read().decode() if helper.stderr else ""
                raise OSError(f"cannot make a user namespace: {err.strip() or 'timed out'}")
            time.sleep(0.0002)
        for name, mapped in (("uid_map", ids), ("gid_map", ids if gids is None else gids)):
            lines = "".join(f"{inner} {host} 1\n" for inner, host in sorted(mapped.items()))
            with open(f"/proc/{helper.pid}/{name}", "w") as mapping:
                mapping.write(lines)  # one write: the kernel takes a map once
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        helper.kill()
        helper.wait()
        if helper.stderr is not None:
            helper.stderr.close()


def idmapped_view(source: str | int, target: str, userns: int, writable: bool = False) -> None:
    """Show ``source`` (a path, or an open directory descriptor: no path is looked up
    again) at ``target`` (an existing directory) read-only, nosuid and nodev, with its ids
    mapped through ``userns`` (from ``userns_mapping``: host uid 0's files appear as that
    sandbox's root uid; other ids appear unmapped). Only the mount ``source`` is on is
    cloned: mounts below it show as their empty mount points. Nothing can be written
    through it, unless ``writable`` (a volume's read-write view: files are written with
    the on-disk ids the mapping gives the writer's host uid; a writer it does not map
    cannot create anything). Raises ``OSError``."""
    open_tree, move_mount, mount_setattr = _syscalls()
    if isinstance(source, int):
        where, name, flags = source, b"", _AT_EMPTY_PATH
    else:
        where, name, flags = _AT_FDCWD, source.encode(), 0
    tree = _check(
        _libc.syscall(open_tree, where, name, flags | _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC),
        f"open_tree {source}",
    )
    try:
        flags = _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
        if not writable:
            flags |= _MOUNT_ATTR_RDONLY
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", flags, 0, 0, userns))
        _check(
            _libc.syscall(mount_setattr, tree, b"", _AT_EMPTY_PATH, attr, 32),
            f"idmap {source}",
        )
        _check(
            _libc.syscall(
                move_mount, tree, b"", _AT_FDCWD, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH
            ),
            f"move_mount {target}",
        )
    finally:
        os.close(tree)


def _syscalls() -> tuple[int, int, int]:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(f"idmapped mounts: unsupported machine {platform.machine()}")
    return numbers
