"""Policy -> bubblewrap argv. Pure: no I/O, tested without privileges.

Every sandbox gets all of these, always (there is no flag to leave one out):
new user, pid, mount, network, ipc, uts and cgroup namespaces; no further user namespaces;
a root built from read-only binds (or overlays, below) and remounted read-only; fresh /proc
and a minimal /dev (read-only, with a size-limited /dev/shm); size-limited tmpfs on the
workspace and /tmp; the sandbox user uid 1000 with no capabilities and no_new_privs; a new
session (no terminal injection); the seccomp filter; death with its supervisor.

A sandbox with a volume (``Writable``: interactive sandboxes when Ringfence is root and bwrap
has overlays) gets its workspace and /tmp bound from the volume instead of in-sandbox tmpfs,
and each of the root's directories that the volume has layers for becomes an overlay (its
idmapped template view below, the sandbox's own upper layer above): the root is writable,
the template is not.

A root-inside sandbox (``Fds`` with a ``userns_block``: see ``userns``) starts its command
as ns root with Docker's capabilities instead of uid 1000, under a map the server writes;
no_new_privs and the filter stay.

The network namespace stays empty (loopback only) even with a network policy: Ringfence's
proxy and resolver are attached to its loopback from the host (``ringfence.network``), and
only the proxy variables are added here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ringfence.backends.local.rootfs import Entry, Kind
from ringfence.backends.local.userns import NS_USER, root_inside_args
from ringfence.models import ExecutionRequest, Mount, NetworkMode, NetworkPolicy, ResourceLimits
from ringfence.network.gateway import proxy_env
from ringfence.network.intercept import SANDBOX_BUNDLE

__all__ = [
    "DEFAULT_PATH",
    "HOSTNAME",
    "LAUNCH_ENV",
    "SANDBOX_GID",
    "SANDBOX_UID",
    "WORKSPACE",
    "Fds",
    "Overlay",
    "Writable",
    "bwrap_args",
    "pack_args",
    "sandbox_env",
]

SANDBOX_UID = NS_USER
SANDBOX_GID = NS_USER
WORKSPACE = "/home/user"
HOSTNAME = "sandbox"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Fds:
    """File descriptors handed to bwrap: the seccomp program, where it reports the sandbox's
    pids, what it waits on before starting the command, and (root inside) what it waits on
    until the server has mapped the sandbox's ids (``info`` is required with it)."""

    seccomp: int
    info: int | None = None
    block: int | None = None
    userns_block: int | None = None


@dataclass(frozen=True)
class Overlay:
    """The layers of one overlaid root directory (host paths)."""

    lower: str  # read-only
    upper: str  # the sandbox's writes
    work: str  # overlayfs's work directory, beside ``upper``


@dataclass(frozen=True)
class Writable:
    """The host directories of a sandbox's volume (``volume.Volume``) that hold what it
    writes: bound at the workspace and /tmp, and the overlays of its root's directories
    (by target); ``shared``: tenants' volumes, each ``(view, target, read_only)``, bound
    after the workspace (a target may be under it)."""

    workspace: str
    tmp: str
    overlays: Mapping[str, Overlay] = field(default_factory=dict)
    shared: tuple[tuple[str, str, bool], ...] = ()
    # The project view: a host directory's overlay at a target (mounted over the
    # workspace, which may hold it); None: no project.
    project: tuple[str, Overlay] | None = None


def sandbox_env(
    env: Mapping[str, str], network: NetworkPolicy | None = None, intercepting: bool = False
) -> dict[str, str]:
    """The sandbox's whole environment: defaults overridden by the request's own variables.
    With a network policy, the proxy variables point tools at Ringfence's proxy (and, when
    it intercepts TLS, node at the trust bundle that holds its CA)."""
    egress = proxy_env() if network is not None and network.mode is NetworkMode.RULES else {}
    if egress and intercepting:
        egress["NODE_EXTRA_CA_CERTS"] = SANDBOX_BUNDLE
    return {
        "PATH": DEFAULT_PATH,
        "HOME": WORKSPACE,
        "USER": "user",
        "LOGNAME": "user",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        # PEP 668 guards a system pip could break; a sandbox's system is its template (read
        # only, or overlaid by its own layer), so Debian's pip, which refuses by default,
        # may install: into ~/.local as the user, into the system where it may write.
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        **egress,
        **env,
    }


def bwrap_args(
    layout: Iterable[Entry],
    request: ExecutionRequest,
    limits: ResourceLimits,
    fds: Fds,
    trust_bundle: str | None = None,
    writable: Writable | None = None,
) -> list[str]:
    """Every bubblewrap option that runs ``request`` with ``limits`` (the command follows).
    ``trust_bundle``: a CA bundle shown at /etc/ssl/certs/ca-certificates.crt instead of
    the root's (the host's plus the egress proxy's CA, when it intercepts TLS).
    ``writable``: the sandbox's volume; None: in-sandbox tmpfs and a read-only root.

    They reach bwrap through ``--args FD``, not its command line: the environment is part of
    them, and a command line is visible to every local user. bwrap itself runs with an empty
    environment (``launch_env``): the request's variables, ``LD_PRELOAD`` included, must only
    ever reach the command inside the sandbox, never a program outside it.
    """
    assert limits.disk is not None, "limits must be merged over the defaults first"
    disk = str(limits.disk)
    if fds.userns_block is None:
        identity = ["--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    else:  # the server forbids nested user namespaces itself (see userns)
        assert fds.info is not None, "the server maps ids by the pid bwrap reports"
        identity = root_inside_args(fds.userns_block)
    argv = [
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
        "--unshare-uts", "--unshare-cgroup",
        "--die-with-parent", "--new-session",
        *identity,
        "--hostname", HOSTNAME,
        "--tmpfs", "/",
    ]  # fmt: skip
    layout = tuple(layout)
    overlays = writable.overlays if writable is not None else {}
    for entry in layout:
        overlay = overlays.get(entry.target) if entry.kind is Kind.RO_BIND else None
        argv += _overlay_args(overlay, entry.target) if overlay else _entry_args(entry)
    shared = writable.shared if writable is not None else ()
    if fds.userns_block is not None:
        project = [writable.project[0]] if writable is not None and writable.project else []
        targets = [
            WORKSPACE,
            *project,
            *(m.target for m in request.mounts),
            *(s[1] for s in shared),
        ]
        argv += _open_parents(targets, layout)
    if trust_bundle is not None:
        argv += ["--ro-bind", trust_bundle, SANDBOX_BUNDLE]
    argv += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "1777", "--size", disk, "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
    ]  # fmt: skip
    if writable is None:
        argv += [
            "--perms", "1777", "--size", disk, "--tmpfs", "/tmp",
            "--perms", "0755", "--size", disk, "--tmpfs", WORKSPACE,
        ]  # fmt: skip
    else:  # the volume's tmpfs bounds them (and the upper layers) together
        argv += ["--bind", writable.tmp, "/tmp", "--bind", writable.workspace, WORKSPACE]
    if writable is not None and writable.project is not None:
        argv += _overlay_args(writable.project[1], writable.project[0])
    for mount in request.mounts:
        argv += _mount_args(mount)
    for view, target, read_only in shared:
        argv += ["--ro-bind" if read_only else "--bind", view, target]
    argv += [
        "--chdir", request.cwd or WORKSPACE,
        "--remount-ro", "/",
        "--seccomp", str(fds.seccomp),
    ]  # fmt: skip
    if fds.info is not None:
        argv += ["--info-fd", str(fds.info)]
    if fds.block is not None:
        argv += ["--block-fd", str(fds.block)]
    argv.append("--clearenv")
    env = sandbox_env(request.env, request.network, intercepting=trust_bundle is not None)
    for name, value in env.items():
        argv += ["--setenv", name, value]
    return argv


def pack_args(args: Iterable[str]) -> bytes:
    """The ``--args FD`` format: each argument NUL-terminated."""
    return b"".join(arg.encode() + b"\0" for arg in args)


# bwrap and the programs that start it run outside the sandbox: nothing of the request.
LAUNCH_ENV: dict[str, str] = {}


def _entry_args(entry: Entry) -> list[str]:
    if entry.kind is Kind.DIR:
        return ["--dir", entry.target]
    if entry.kind is Kind.SYMLINK:
        return ["--symlink", entry.source, entry.target]
    return ["--ro-bind", entry.source, entry.target]


def _overlay_args(overlay: Overlay, target: str) -> list[str]:
    return ["--overlay-src", overlay.lower, "--overlay", overlay.upper, overlay.work, target]


def _open_parents(targets: Iterable[str], layout: Iterable[Entry]) -> list[str]:
    """Root inside, bwrap makes the directories a mount point needs as ns root, 0700: each
    is made first here, 0755, so the sandbox user can reach what is mounted below it."""
    made = {entry.target for entry in layout}
    argv: list[str] = []
    for target in targets:
        parts = target.strip("/").split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:depth])
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
    return argv


def _mount_args(mount: Mount) -> list[str]:
    return ["--bind" if mount.writable else "--ro-bind", mount.source, mount.target]
