"""Root inside, never on the host: the user namespace of an interactive sandbox.

A one-shot execution's namespace maps one id, the sandbox user 1000, to its host uid (bwrap
writes that map itself). An interactive sandbox's namespace maps two, written by the server
(host root) while bwrap's child waits on ``--userns-block-fd``:

- ns 0 (root) to the sandbox's first host uid: its daemon runs as it, with Docker's default
  capabilities (``DOCKER_CAPABILITIES``), and so do the commands asked for as ``root``;
- ns 1000 (``user``) to its second: every other command runs as it, with no capabilities.

Gids are the same numbers. No other id is mapped: host root is not (a file of the host's
root shows as ``nobody`` and ns root's ``CAP_DAC_OVERRIDE`` does not apply to it), and
neither is any other sandbox's uid. Every capability is held in the sandbox's own user
namespace only: none reaches an object the host owns. no_new_privs and the seccomp filter
apply to the daemon and everything it starts, as in a one-shot execution.

bwrap refuses ``--disable-userns`` together with ``--userns-block-fd``, so the server does
what that option does itself: it sets ``user.max_user_namespaces`` to 0 inside the
sandbox's namespace (a limit only ``CAP_SYS_RESOURCE`` there could raise, which the
sandbox never holds), on top of the seccomp filter that refuses ``unshare``, ``setns`` and
``clone(CLONE_NEWUSER)``.

Which launches run as root inside: those the executor has reserved as interactive
sandboxes (``LocalExecutor.reserve``), when Ringfence is host root.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from ringfence.errors import SandboxError

__all__ = [
    "DOCKER_CAPABILITIES",
    "NS_ROOT",
    "NS_USER",
    "HostIds",
    "enter_ids",
    "id_map",
    "root_inside_args",
]

NS_ROOT = 0
NS_USER = 1000  # the sandbox user (``bwrap.SANDBOX_UID``)

# Docker's default set (moby's oci/caps/defaults.go): what ``root`` holds inside.
DOCKER_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SYS_CHROOT",
    "CAP_MKNOD",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
)

_NSENTER_SECONDS = 5.0


@dataclass(frozen=True)
class HostIds:
    """The two host uids (and gids of the same numbers) of one root-inside sandbox."""

    root: int  # ns 0: the daemon, and commands asked for as root
    user: int  # ns 1000: every other command, and the workspace's owner


def id_map(ids: HostIds) -> str:
    """The ``uid_map`` (and ``gid_map``) of a root-inside sandbox: two lines, nothing else."""
    return f"{NS_ROOT} {ids.root} 1\n{NS_USER} {ids.user} 1\n"


def root_inside_args(userns_block_fd: int) -> list[str]:
    """bwrap's identity options for a root-inside sandbox (pure): its command starts as
    ns root with exactly Docker's capabilities once the map is written and a byte arrives
    on ``userns_block_fd``. bwrap's own switch to another uid does nothing under an
    external map: the daemon drops to the user for each command itself."""
    args = ["--uid", str(NS_ROOT), "--gid", str(NS_ROOT)]
    for capability in DOCKER_CAPABILITIES:
        args += ["--cap-add", capability]
    return [*args, "--userns-block-fd", str(userns_block_fd)]


async def enter_ids(pid: int, ids: HostIds, nsenter: str) -> None:
    """Give the user namespace of bwrap's child ``pid`` (waiting on its userns gate) its
    two-id map, then forbid it nested user namespaces. Host root only.

    Raises:
        SandboxError: the kernel refused the map, or the limit could not be set: the
            sandbox must not start (fail closed).
    """
    mapping = id_map(ids).encode()
    try:
        for name in ("uid_map", "gid_map"):
            fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, mapping)
            finally:
                os.close(fd)
    except OSError as exc:
        raise SandboxError(f"cannot map the sandbox's ids: {exc.strerror}") from exc
    await _forbid_nested_userns(pid, nsenter)


async def _forbid_nested_userns(pid: int, nsenter: str) -> None:
    # nsenter becomes the namespace's root (host uid ids.root, full capabilities there),
    # so the shell it execs keeps them: a process that stayed host root would be unmapped
    # there and lose them at exec. Nothing of the sandbox runs yet: bwrap's child waits.
    write = "echo 0 > /proc/sys/user/max_user_namespaces"
    argv = [nsenter, f"--user=/proc/{pid}/ns/user", "--", "/bin/sh", "-c", write]
    try:
        helper = await asyncio.create_subprocess_exec(
            *argv,
            env={},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise SandboxError(f"cannot run {nsenter}: {exc.strerror}") from exc
    try:
        _, err = await asyncio.wait_for(helper.communicate(), _NSENTER_SECONDS)
    except TimeoutError:
        helper.kill()
        await helper.wait()
        raise SandboxError("forbidding nested user namespaces timed out") from None
    if helper.returncode != 0:
        reason = err.decode(errors="replace").strip() or f"exit {helper.returncode}"
        raise SandboxError(f"cannot forbid nested user namespaces: {reason}")
