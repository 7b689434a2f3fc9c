"""Cgroup limits for sandboxes, on cgroup v2 (unified) and cgroup v1 (legacy and hybrid hosts).

Each sandbox gets its own cgroup ``<our cgroup>/ringfence/i<our pid>/<name>`` with a memory,
pids and CPU limit. The per-process level lets a starting Ringfence clean up after one that
died (its sandboxes died with it, through bwrap's --die-with-parent, but not their cgroups)
without touching the cgroups of one still running beside it. The sandbox's init is moved in
before the command starts, so every process of the sandbox is counted and can be found (and
killed) through ``cgroup.procs``.

v2 needs the memory, pids and cpu controllers delegated to our cgroup; a cgroup with processes
cannot hand controllers to children, so on v2 Ringfence moves itself into a leaf
``<our cgroup>/supervisor`` first (the layout systemd's ``Delegate=yes`` expects).
v1 has one hierarchy per controller and no ``cgroup.kill``: killing means signalling every pid
in ``cgroup.procs`` until it stays empty.

Freezing (a checkpoint's consistent instant, a pause that keeps memory) stops every task of
the cgroup where it is: v2 through ``cgroup.freeze`` (every v2 cgroup has it), v1 through the
freezer hierarchy, used beside memory, pids and cpu when the host mounts one. A v1 host
without it still runs sandboxes; ``Cgroup.can_freeze`` is False there and ``freeze`` raises
``StateUnsupported``. ``freeze`` returns only once the kernel reports every task stopped
(v1 ``freezer.state`` FROZEN, v2 ``cgroup.events`` "frozen 1"), within a bound. A v1 task
that is frozen does not die of SIGKILL until thawed, so ``kill_all`` thaws after signalling:
the pending SIGKILL is all the task runs.

Usage (``Cgroup.usage``, the sandbox's metrics) is read from the cgroup's own files when
asked, never sampled: v2's ``cpu.stat``, ``memory.current`` and ``pids.current``; v1's
memory and pids hierarchies, and CPU time from the cpuacct hierarchy when the host mounts
one (it is joined beside the others, like the freezer; without it CPU time is unknown).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ringfence.errors import BackendUnavailable, SandboxError, StateUnsupported
from ringfence.models import ResourceLimits

__all__ = ["Cgroup", "CgroupDriver", "CgroupUsage", "detect"]

CONTROLLERS = ("memory", "pids", "cpu")
FREEZER = "freezer"  # v1 only, optional: without it sandboxes run but cannot be frozen
# v1 only, optional: the CPU time a sandbox used (v2's cpu.stat has it in every cgroup).
# Often mounted with cpu ("cpu,cpuacct"): then it is the cpu directory itself.
CPUACCT = "cpuacct"
OPTIONAL_V1 = (FREEZER, CPUACCT)
GROUP = "ringfence"
_CPU_PERIOD_US = 100_000
_KILL_ROUNDS = 2000  # x 1 ms: a sandbox whose pids keep reappearing for 2 s is an error
_RMDIR_ROUNDS = 1000
_V1_UNLIMITED = 1 << 62  # v1 shows "no memory limit" as a page-rounded LONG_MAX
_FREEZE_SECONDS = 2.0  # a cgroup not frozen by then (a task stuck in the kernel) is an error


@dataclass(frozen=True)
class CgroupUsage:
    """What a cgroup's processes use now (``Cgroup.usage``)."""

    cpu_seconds: float | None  # since the cgroup was made; None: not accounted here
    memory_bytes: int  # charged to it now, without the page cache it could drop at once
    memory_cache_bytes: int  # of which page cache (tmpfs files written count here too)
    pids: int  # processes and threads now
    memory_limit: int  # 0: none
    cpus: float  # its CPU quota in cores; 0: none


class Cgroup(ABC):
    """The cgroup(s) of one sandbox.

    Every method blocks: cgroup writes wait on kernel locks (on cgroup v1 a move between
    cgroups can wait for an RCU grace period, a few milliseconds under load).
    """

    @abstractmethod
    def add(self, pid: int) -> bool:
        """Move ``pid`` into the cgroup; False if it has already exited.

        Raises:
            SandboxError: the kernel refused the move.
        """

    @abstractmethod
    def pids(self) -> list[int]:
        """Every process in the cgroup."""

    @abstractmethod
    def oom_kills(self) -> int:
        """How many processes the out-of-memory killer has killed in this cgroup."""

    @abstractmethod
    def usage(self) -> CgroupUsage:
        """What its processes use now: a few small reads of its own files (no sampling,
        nothing kept). Raises ``SandboxError`` once the cgroup is gone."""

    @abstractmethod
    def cpu_seconds(self) -> float | None:
        """Its CPU time alone (one read; None where not accounted): unchanged since an
        earlier read means none of its tasks has run since. Raises ``SandboxError``."""

    @property
    @abstractmethod
    def accounts_cpu(self) -> bool:
        """Whether ``cpu_seconds`` reads a kernel counter (False: a cgroup v1 host without
        a cpuacct hierarchy, where CPU time must be counted from ``/proc``)."""

    @abstractmethod
    def _dirs(self) -> list[Path]: ...

    @property
    @abstractmethod
    def can_freeze(self) -> bool:
        """Whether this host lets the cgroup be frozen (v2 always; v1 with a freezer)."""

    @abstractmethod
    def _request_freeze(self, frozen: bool) -> None:
        """Ask the kernel to freeze (or thaw) every task; it may not be done yet."""

    @abstractmethod
    def is_frozen(self) -> bool:
        """True once every task of the cgroup is stopped (False while still freezing)."""

    def freeze(self) -> None:
        """Stop every task of the cgroup, returning once the kernel says all are stopped.

        Raises:
            StateUnsupported: no freezer on this host (a v1 host without its hierarchy).
            SandboxError: the kernel refused, or the cgroup did not freeze in time (it is
                thawed again then: never left half frozen).
        """
        if not self.can_freeze:
            raise StateUnsupported(
                "sandboxes cannot be frozen here: this cgroup v1 host mounts no freezer "
                "hierarchy (mount -t cgroup -o freezer cgroup /sys/fs/cgroup/freezer)"
            )
        self._request_freeze(True)
        if not _wait_until(self.is_frozen, _FREEZE_SECONDS, retry=self._freeze_retry):
            self._request_freeze(False)
            raise SandboxError(f"{self._dirs()[0]} did not freeze within {_FREEZE_SECONDS} s")

    def thaw(self) -> None:
        """Let every task run again; a no-op on a cgroup that is not frozen (or cannot be).
        Raises ``SandboxError`` when the kernel refuses."""
        if self.can_freeze:
            self._request_freeze(False)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Frozen for the block, thawed after it whatever happens (``freeze``'s errors)."""
        self.freeze()
        try:
            yield
        finally:
            self.thaw()

    @abstractmethod
    def _freeze_retry(self) -> None:
        """Called while waiting for the freeze (v1 asks again; v2 needs nothing)."""

    def kill_all(self) -> None:
        """SIGKILL every process until the cgroup is empty (frozen ones too: they are
        thawed after the signal, so it is the first thing they run). Raises
        ``SandboxError``."""
        for _ in range(_KILL_ROUNDS):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if self.can_freeze:
                with contextlib.suppress(SandboxError):
                    self._request_freeze(False)
            time.sleep(0.001)
        raise SandboxError(f"processes survive in {self._dirs()[0]}")

    def discard(self) -> None:
        """Remove the directories of a cgroup that never held a process."""
        for directory in self._dirs():
            _try_rmdir(directory)

    def remove(self) -> None:
        """Kill what is left and remove the cgroup directories. Raises ``SandboxError``."""
        self.kill_all()
        for directory in self._dirs():
            for _ in range(_RMDIR_ROUNDS):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise SandboxError(f"cannot remove {directory}: {exc}") from exc
                    time.sleep(0.001)
            else:
                raise SandboxError(f"cannot remove {directory}: still busy")


class CgroupDriver(ABC):
    """Creates sandbox cgroups on one host."""

    version: int

    @property
    def can_freeze(self) -> bool:
        """Whether its cgroups can be frozen (``Cgroup.freeze``)."""
        return True

    @abstractmethod
    def create(self, name: str, limits: ResourceLimits) -> Cgroup:
        """Create the cgroup ``name`` with ``limits``. Raises ``SandboxError``."""

    @abstractmethod
    def describe(self) -> str:
        """Where the cgroups live, in words."""


# -- v1 ---------------------------------------------------------------------------------------


@dataclass
class _V1Cgroup(Cgroup):
    dirs: dict[str, Path]  # controller -> directory
    _limits: tuple[int, float] | None = field(default=None, init=False, repr=False)

    def add(self, pid: int) -> bool:
        return all(_move(directory, pid) for directory in self.dirs.values())

    def pids(self) -> list[int]:
        return _read_pids(self.dirs["pids"] / "cgroup.procs")

    def oom_kills(self) -> int:
        return _read_counter(self.dirs["memory"] / "memory.oom_control", "oom_kill")

    def usage(self) -> CgroupUsage:
        memory = str(self.dirs["memory"])
        stat = _read_bytes(f"{memory}/memory.stat")
        total = int(_read_bytes(f"{memory}/memory.usage_in_bytes"))
        cpu = self.cpu_seconds()
        if self._limits is None:  # set at create, never changed: read once
            quota = int(_read_bytes(f"{self.dirs['cpu']}/cpu.cfs_quota_us"))
            period = int(_read_bytes(f"{self.dirs['cpu']}/cpu.cfs_period_us"))
            limit = int(_read_bytes(f"{memory}/memory.limit_in_bytes"))
            self._limits = (
                limit if limit < _V1_UNLIMITED else 0,
                quota / period if quota > 0 and period > 0 else 0.0,
            )
        return CgroupUsage(
            cpu_seconds=cpu,
            memory_bytes=max(0, total - _stat_value(stat, b"total_inactive_file")),
            memory_cache_bytes=_stat_value(stat, b"total_cache"),
            pids=int(_read_bytes(f"{self.dirs['pids']}/pids.current")),
            memory_limit=self._limits[0],
            cpus=self._limits[1],
        )

    def cpu_seconds(self) -> float | None:
        if CPUACCT not in self.dirs:
            return None
        return int(_read_bytes(f"{self.dirs[CPUACCT]}/cpuacct.usage")) / 1e9

    @property
    def accounts_cpu(self) -> bool:
        return CPUACCT in self.dirs

    def _dirs(self) -> list[Path]:
        # cpu and cpuacct share one directory where the host mounts them together.
        return list(dict.fromkeys(self.dirs.values()))

    @property
    def can_freeze(self) -> bool:
        return FREEZER in self.dirs

    def _request_freeze(self, frozen: bool) -> None:
        _write(self.dirs[FREEZER] / "freezer.state", "FROZEN" if frozen else "THAWED")

    def _freeze_retry(self) -> None:
        # v1 moves FREEZING -> FROZEN only when asked again once every task has stopped.
        self._request_freeze(True)

    def is_frozen(self) -> bool:
        if not self.can_freeze:
            return False
        return _read(self.dirs[FREEZER] / "freezer.state") == "FROZEN"


class V1Driver(CgroupDriver):
    version = 1

    def __init__(self, groups: dict[str, Path]) -> None:
        self.groups = groups  # controller -> <our cgroup>/ringfence/i<pid> (+ the freezer)

    @property
    def can_freeze(self) -> bool:
        return FREEZER in self.groups

    def create(self, name: str, limits: ResourceLimits) -> Cgroup:
        cgroup = _V1Cgroup({c: group / name for c, group in self.groups.items()})
        try:
            for directory in cgroup.dirs.values():
                directory.mkdir(exist_ok=True)
            for filename, value in v1_limit_files(limits):
                controller = filename.split(".")[0]
                path = cgroup.dirs[controller] / filename
                if filename != "memory.memsw.limit_in_bytes" or path.exists():
                    _write(path, value)
        except (OSError, SandboxError) as exc:
            for directory in cgroup.dirs.values():
                _try_rmdir(directory)
            raise SandboxError(f"cannot create the sandbox's cgroup: {exc}") from exc
        return cgroup

    def describe(self) -> str:
        return "cgroup v1: " + ", ".join(str(p) for p in self.groups.values())


def v1_limit_files(limits: ResourceLimits) -> list[tuple[str, str]]:
    """The files and values that apply ``limits`` in cgroup v1 (pure)."""
    assert limits.memory is not None and limits.pids is not None and limits.cpus is not None
    return [
        ("memory.limit_in_bytes", str(limits.memory)),
        ("memory.memsw.limit_in_bytes", str(limits.memory)),  # no escape into swap
        ("pids.max", str(limits.pids)),
        ("cpu.cfs_period_us", str(_CPU_PERIOD_US)),
        ("cpu.cfs_quota_us", str(_cpu_quota(limits.cpus))),
    ]


# -- v2 ---------------------------------------------------------------------------------------


@dataclass
class _V2Cgroup(Cgroup):
    directory: Path
    _limits: tuple[int, float] | None = field(default=None, init=False, repr=False)

    def add(self, pid: int) -> bool:
        return _move(self.directory, pid)

    def pids(self) -> list[int]:
        return _read_pids(self.directory / "cgroup.procs")

    def oom_kills(self) -> int:
        return _read_counter(self.directory / "memory.events", "oom_kill")

    def usage(self) -> CgroupUsage:
        directory = str(self.directory)
        stat = _read_bytes(f"{directory}/memory.stat")
        cpu = self.cpu_seconds()
        if self._limits is None:  # set at create, never changed: read once
            quota, _, period = _read_bytes(f"{directory}/cpu.max").partition(b" ")
            limit = _read_bytes(f"{directory}/memory.max").strip()
            self._limits = (
                0 if limit == b"max" else int(limit),
                0.0 if quota == b"max" else int(quota) / int(period or _CPU_PERIOD_US),
            )
        current = int(_read_bytes(f"{directory}/memory.current"))
        return CgroupUsage(
            cpu_seconds=cpu,
            memory_bytes=max(0, current - _stat_value(stat, b"inactive_file")),
            memory_cache_bytes=_stat_value(stat, b"file"),
            pids=int(_read_bytes(f"{directory}/pids.current")),
            memory_limit=self._limits[0],
            cpus=self._limits[1],
        )

    def cpu_seconds(self) -> float:
        return _stat_value(_read_bytes(f"{self.directory}/cpu.stat"), b"usage_usec") / 1e6

    @property
    def accounts_cpu(self) -> bool:
        return True

    def _dirs(self) -> list[Path]:
        return [self.directory]

    @property
    def can_freeze(self) -> bool:
        return True  # cgroup.freeze is in every non-root v2 cgroup (Linux 5.2 and later)

    def _request_freeze(self, frozen: bool) -> None:
        _write(self.directory / "cgroup.freeze", "1" if frozen else "0")

    def _freeze_retry(self) -> None:
        pass  # one write to cgroup.freeze is enough: the kernel finishes on its own

    def is_frozen(self) -> bool:
        return _read_counter(self.directory / "cgroup.events", "frozen") == 1

    def kill_all(self) -> None:
        kill_file = self.directory / "cgroup.kill"
        if kill_file.exists() and self.pids():
            _write(kill_file, "1")
        super().kill_all()


class V2Driver(CgroupDriver):
    version = 2

    def __init__(self, group: Path) -> None:
        self.group = group  # <our cgroup>/ringfence/i<pid>, with the controllers enabled

    def create(self, name: str, limits: ResourceLimits) -> Cgroup:
        cgroup = _V2Cgroup(self.group / name)
        try:
            cgroup.directory.mkdir(exist_ok=True)
            for filename, value in v2_limit_files(limits):
                path = cgroup.directory / filename
                if filename != "memory.swap.max" or path.exists():
                    _write(path, value)
        except (OSError, SandboxError) as exc:
            _try_rmdir(cgroup.directory)
            raise SandboxError(f"cannot create the sandbox's cgroup: {exc}") from exc
        return cgroup

    def describe(self) -> str:
        return f"cgroup v2: {self.group}"


def v2_limit_files(limits: ResourceLimits) -> list[tuple[str, str]]:
    """The files and values that apply ``limits`` in cgroup v2 (pure)."""
    assert limits.memory is not None and limits.pids is not None and limits.cpus is not None
    return [
        ("memory.max", str(limits.memory)),
        ("memory.swap.max", "0"),
        ("pids.max", str(limits.pids)),
        ("cpu.max", f"{_cpu_quota(limits.cpus)} {_CPU_PERIOD_US}"),
    ]


def _delegate_v2(own: Path) -> Path:
    """Enable our controllers for ``own/ringfence`` and return it."""
    wanted = " ".join("+" + c for c in CONTROLLERS)
    subtree = own / "cgroup.subtree_control"
    if not set(CONTROLLERS) <= set(subtree.read_text().split()):
        try:
            _write(subtree, wanted)
        except SandboxError:
            # "No internal processes": leave our cgroup for a leaf, then delegate.
            leaf = own / "supervisor"
            leaf.mkdir(exist_ok=True)
            _write(leaf / "cgroup.procs", str(os.getpid()))
            _write(subtree, wanted)
    group = own / GROUP
    group.mkdir(exist_ok=True)
    _write(group / "cgroup.subtree_control", wanted)
    sweep_stale_instances(group)
    instance = group / instance_name()
    instance.mkdir(exist_ok=True)
    _write(instance / "cgroup.subtree_control", wanted)
    return instance


def instance_name(pid: int | None = None) -> str:
    return f"i{os.getpid() if pid is None else pid}"


def sweep_stale_instances(group: Path) -> None:
    """Kill and remove what is left in the cgroups of Ringfence processes that are gone."""
    for instance in group.iterdir():
        pid = instance.name[1:]
        if not instance.is_dir() or not instance.name.startswith("i") or not pid.isdigit():
            continue
        if Path("/proc", pid).exists():
            continue
        for cgroup in [*(p for p in instance.iterdir() if p.is_dir()), instance]:
            for _ in range(_RMDIR_ROUNDS):
                for leftover in _read_pids(cgroup / "cgroup.procs"):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(leftover, signal.SIGKILL)
                try:
                    cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.001)


# -- discovery --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupMount:
    mountpoint: str
    root: str
    fstype: str
    options: frozenset[str]


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup mounts listed in ``/proc/self/mountinfo`` (pure)."""
    mounts = []
    for line in text.splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        root, mountpoint = (_unescape(f) for f in fields[3:5])
        mounts.append(CgroupMount(mountpoint, root, rest[0], frozenset(rest[2].split(","))))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller -> our path, from ``/proc/self/cgroup``; the v2 entry is under "" (pure)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _own_dir(mount: CgroupMount, path: str) -> Path:
    if mount.root != "/" and path.startswith(mount.root):
        path = path[len(mount.root) :]
    candidate = Path(mount.mountpoint + path)
    return candidate if candidate.is_dir() else Path(mount.mountpoint)


def detect() -> CgroupDriver:
    """The driver for this host: v2 where it has our controllers, else v1.

    Raises:
        BackendUnavailable: neither hierarchy offers memory, pids and cpu to us.
    """
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    problems = []
    for mount in (m for m in mounts if m.fstype == "cgroup2"):
        directory = _own_dir(mount, own.get("", "/"))
        available = set((directory / "cgroup.controllers").read_text().split())
        if set(CONTROLLERS) <= available:
            try:
                return V2Driver(_delegate_v2(directory))
            except (OSError, SandboxError) as exc:
                problems.append(f"cgroup v2 at {directory}: {exc}")
    groups: dict[str, Path] = {}
    for controller in (*CONTROLLERS, *OPTIONAL_V1):
        v1 = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if v1 is None:
            continue
        group = _own_dir(v1, own.get(controller, "/")) / GROUP
        try:
            group.mkdir(exist_ok=True)
            sweep_stale_instances(group)
            instance = group / instance_name()
            instance.mkdir(exist_ok=True)
            groups[controller] = instance
        except OSError as exc:
            problems.append(f"cgroup v1 {controller} at {group}: {exc.strerror}")
    if set(CONTROLLERS) <= set(groups):
        return V1Driver(groups)
    missing = [c for c in CONTROLLERS if c not in groups]
    raise BackendUnavailable(
        "no usable cgroup for the memory, pids and cpu limits "
        f"(missing: {', '.join(missing)}; {'; '.join(problems) or 'controllers not mounted'}). "
        "Run Ringfence as root, or in a cgroup v2 subtree delegated to it "
        "(systemd-run --user --scope -p Delegate=yes ...)"
    )


# -- small file helpers -----------------------------------------------------------------------


def _cpu_quota(cpus: float) -> int:
    return max(1000, int(cpus * _CPU_PERIOD_US))


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        raise SandboxError(f"cannot write {value!r} to {path}: {exc.strerror}") from exc


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise SandboxError(f"cannot read {path}: {exc.strerror}") from exc


def _wait_until(done: Callable[[], bool], seconds: float, retry: Callable[[], None]) -> bool:
    """Poll ``done`` until it is true or ``seconds`` pass; spin first (a freeze usually
    takes tens of microseconds), then back off to a millisecond."""
    deadline = time.monotonic() + seconds
    pause = 0.0
    while not done():
        if time.monotonic() > deadline:
            return False
        retry()
        if pause:
            time.sleep(pause)
        pause = min(0.001, pause * 2 or 0.00002)
    return True


def _move(directory: Path, pid: int) -> bool:
    try:
        _write(directory / "cgroup.procs", str(pid))
    except SandboxError as exc:
        if isinstance(exc.__cause__, ProcessLookupError):
            return False
        raise
    return True


def _read_bytes(path: str) -> bytes:
    """A small cgroup file's bytes, cheaply (no text layer: ``usage`` reads several per
    sandbox on every scrape). Raises ``SandboxError``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return os.read(fd, 1 << 16)
    except OSError as exc:
        raise SandboxError(f"cannot read {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _stat_value(data: bytes, key: bytes) -> int:
    """The value of ``key`` in a flat-keyed file's bytes ("name value" lines); 0 if absent."""
    start = data.find(key + b" ")
    while start > 0 and data[start - 1 : start] != b"\n":  # a longer key ending in it
        start = data.find(key + b" ", start + 1)
    if start < 0:
        return 0
    end = data.find(b"\n", start)
    return int(data[start + len(key) + 1 : end if end >= 0 else None])


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except FileNotFoundError:
        return []


def _read_counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except FileNotFoundError:
        pass
    return 0


def _try_rmdir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        directory.rmdir()


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
