"""``FakeSandboxRuntime``: interactive sandboxes served by the real daemon, unsandboxed.

Each sandbox is the real ``ringfence.sandboxd`` run as a plain subprocess of the test (the
``process`` backend's way: the test's own user, the host's filesystem and network), on a
unix socket handed over as on the local backend. Commands, files, watches and code calls
therefore behave as the daemon behaves everywhere, and a sandbox starts in tens of
milliseconds; its deadline, kill and end are the same ``DaemonSandbox`` as the local
backend's.

It isolates nothing: a test on it proves the logic above the runtime (routes, services,
SDK, MCP), never a claim about sandboxes. What differs from a real sandbox:

- the spec's image, limits and network policy are recorded (``specs``), not applied;
  the daemon and its commands run as the test's user and see the host's filesystem, except
  ``/home/user`` (HOME, as in a real sandbox), a fresh directory of each sandbox's own laid
  there by bubblewrap in a mount namespace (``private_home=False``: no bubblewrap, and HOME
  is that directory where it is on the host);
- its state (``testing.fakes.state``) is that home directory only, copied; freeze is
  ``SIGSTOP``; nothing of a process's memory is ever captured;
- a spec's volumes are their host directories bound at their targets (read-only when
  asked), with no id mapping (bubblewrap only);
- a kill reaches the daemon and every process it started that is still its descendant
  (found through ``/proc``); one whose parent died before the kill escapes it, as on the
  ``process`` backend.

Why not the ``process`` backend itself: it has no runtime on purpose (in production,
nothing would contain a long-lived daemon). Here that is the point: tests of logic.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import ringfence.sandboxd
from ringfence.backends import BoundVolume, LaunchSpec
from ringfence.backends.daemon_sandbox import listen, start_daemon_sandbox
from ringfence.backends.process import ProcessExecutor
from ringfence.backends.supervisor import Launched, SupervisedProcess
from ringfence.config import Config
from ringfence.errors import BackendUnavailable, StateUnsupported
from ringfence.models import ExecutionRequest, ResourceLimits
from ringfence.testing.fakes.state import FakeStatefulSandbox, restore_into

__all__ = ["SANDBOX_HOME", "FakeSandboxRuntime"]

SANDBOX_HOME = "/home/user"  # as in every real sandbox
_START_SECONDS = 10.0
_KILL_ROUNDS = 100  # a tree forking while we kill it: scan again, this many times at most
_PACKAGE_PARENT = str(Path(ringfence.sandboxd.__file__).parent.parent)
_BOOT = f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); import sandboxd.__main__"


class FakeSandboxRuntime:
    """A ``SandboxRuntime`` for tests of logic (see the module docstring for what differs).

    ``specs`` lists the ``LaunchSpec`` of every sandbox started, in order. ``aclose`` kills
    every sandbox still running and removes the sockets' directory.
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        private_home: bool = True,
        export_key: bytes | None = None,
        freezer: bool = True,
    ) -> None:
        """Raises ``BackendUnavailable`` when ``private_home`` and bubblewrap is missing.

        Its sandboxes have state (``testing.fakes.state``): exports sealed with
        ``export_key`` (default: a key of this runtime only; give the same one to a
        runtime that must restore another's exports, as after a restart), frozen with
        ``SIGSTOP`` unless ``freezer`` is False (then freeze is ``StateUnsupported``)."""
        config = config or Config()
        bwrap = shutil.which("bwrap") if private_home else None
        if private_home and bwrap is None:
            raise BackendUnavailable(
                "the fake runtime lays each sandbox's /home/user with bubblewrap, which is "
                "not installed (or pass private_home=False)"
            )
        self._executor = _DaemonExecutor(config.model_copy(update={"default_image": "host"}), bwrap)
        # Short and our own: a unix socket's path has at most 107 bytes.
        self._sockets = Path(tempfile.mkdtemp(prefix="rf-fake-"))
        self.specs: list[LaunchSpec] = []
        self._key = export_key or secrets.token_bytes(32)
        self._freezer = freezer

    async def start(self, spec: LaunchSpec) -> FakeStatefulSandbox:
        """Start the daemon; return once its process runs (its first request waits in the
        socket's backlog while it starts).

        Raises:
            SandboxError: the daemon could not be started.
        """
        self.specs.append(spec)
        run_id = uuid.uuid4().hex  # the daemon's execution: no tenant sees it
        socket_path = self._sockets / f"{run_id[:16]}.sock"
        listener = listen(socket_path)
        request = ExecutionRequest(
            id=run_id,
            image="host",
            command=[sys.executable, "-I", "-S", "-B", "-c", _BOOT],
            args=["--listen-fd", str(listener.fileno())],
            env=spec.env,
            timeout=spec.timeout,
        )
        if spec.restore is not None:  # checked before anything starts
            self._executor.restores[run_id] = (spec.restore, self._key)
        if spec.volumes and self._executor.bwrap is None:
            raise StateUnsupported("the fake runtime mounts volumes with bubblewrap only")
        self._executor.volumes[run_id] = spec.volumes
        try:
            sandbox = await start_daemon_sandbox(
                self._executor, request, listener, socket_path, _START_SECONDS
            )
        finally:
            self._executor.restores.pop(run_id, None)
            self._executor.volumes.pop(run_id, None)
        tree = self._executor.trees[run_id]
        return FakeStatefulSandbox(sandbox, tree.home, tree.pids, self._key, freezer=self._freezer)

    async def aclose(self) -> None:
        await self._executor.aclose()
        shutil.rmtree(self._sockets, ignore_errors=True)


class _DaemonExecutor(ProcessExecutor):
    """The process backend, its kill reaching the daemon's own sessions too."""

    name = "fake"

    def __init__(self, config: Config, bwrap: str | None) -> None:
        super().__init__(config)
        self.bwrap = bwrap
        self.restores: dict[str, tuple[Path, bytes]] = {}  # run id -> (export, its key)
        self.volumes: dict[str, tuple[BoundVolume, ...]] = {}  # run id -> volumes to bind
        self.trees: dict[str, _DaemonTree] = {}  # run id -> its processes, while it runs

    async def _launch(
        self, request: ExecutionRequest, limits: ResourceLimits, pass_fds: Sequence[int]
    ) -> Launched:
        home = Path(tempfile.mkdtemp(prefix="rf-fake-home-"))
        if request.id in self.restores:
            try:
                source, key = self.restores[request.id]
                restore_into(source, home, key)
            except BaseException:
                shutil.rmtree(home, ignore_errors=True)
                raise
        if self.bwrap is None:
            env = {"HOME": str(home), **request.env}
            command = request.command
        else:
            env = {"HOME": SANDBOX_HOME, **request.env}
            # The host's root read-only, as a real sandbox's is: tests run as root, and a
            # test of logic must not write into the host (a PUT of /usr/x answered 200 on a
            # writable view). HOME is the sandbox's own; /dev and /tmp stay the host's (a
            # checkout under /tmp, as CI's, holds the interpreter and the daemon it runs).
            # A volume is its host directory bound as it is (no id mapping: the fake's
            # daemon is the host's root).
            binds = [
                arg
                for bound in self.volumes.get(request.id, ())
                for arg in ("--ro-bind" if bound.read_only else "--bind", str(bound.source),
                            bound.target)
            ]  # fmt: skip
            command = [*host_view(self.bwrap, home), *binds, "--", *request.command]
        daemon = request.model_copy(update={"command": command, "env": env})
        try:
            launched = await super()._launch(daemon, limits, pass_fds)
        except BaseException:
            shutil.rmtree(home, ignore_errors=True)
            raise
        tree = self.trees[request.id] = _DaemonTree(launched, home)
        tree.forget = lambda: self.trees.pop(request.id, None)
        return tree


# Run in a mount namespace of its own: every real sandbox's volume detached, then bwrap.
_WITHOUT_VOLUMES = (
    "for point in $(awk '$5 ~ /\\/volumes\\/i[0-9]+\\// {print $5}' /proc/self/mountinfo "
    '| sort -r); do umount -l "$point" 2>/dev/null; done; exec "$@"'
)


def host_view(bwrap: str, home: Path) -> list[str]:
    """The command that runs what follows it (after ``--``) in the fake's view: the host's
    root read-only, /dev and /tmp the host's, ``home`` at /home/user.

    ``--ro-bind / /`` copies every mount of the host, then remounts each copy read-only
    one by one; a real sandbox's volume (``backends/local/volume.py``) whose mount point
    the server removes meanwhile vanishes from the copy too, and bwrap failed ("Can't bind
    mount /oldroot/ ... remount ...: No such file or directory", ~1 start in 75 while
    real sandboxes came and went). As root, bwrap runs in a mount namespace of its own in
    which every volume is detached first (``unshare -m``, ``umount -l``; one that is gone
    already is skipped), so its walk never meets one; the fake's sandboxes see none."""
    view = [
        bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--bind", "/tmp", "/tmp",
        "--tmpfs", "/home", "--bind", str(home), SANDBOX_HOME, "--chdir", SANDBOX_HOME,
    ]  # fmt: skip
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:  # no volumes to meet without root
        return view
    return [unshare, "--mount", "--propagation", "slave", "sh", "-c", _WITHOUT_VOLUMES,
            "sh", *view]  # fmt: skip


class _DaemonTree:
    """The daemon's process group, and the sessions of what it started (``setsid``)."""

    def __init__(self, launched: Launched, home: Path) -> None:
        self._launched = launched
        self.home = home
        self.name = launched.name
        self.killed = "the daemon and its descendants were killed"
        self.forget: Callable[[], object] = lambda: None

    def pids(self) -> list[int]:
        """The daemon's process (bubblewrap's, with a private home) and its descendants."""
        pid = getattr(self.child, "pid", None)
        if not isinstance(pid, int) or self.child.returncode is not None:
            return []
        return [pid, *descendants(pid)]

    @property
    def child(self) -> SupervisedProcess:
        return self._launched.child

    async def kill(self) -> None:
        _kill_descendants(self.child)
        await self._launched.kill()

    async def release(self) -> str | None:
        _kill_descendants(self.child)
        cause = await self._launched.release()
        shutil.rmtree(self.home, ignore_errors=True)
        self.forget()
        return cause

    def setup_error(self, exit_code: int, head: str) -> str | None:
        return self._launched.setup_error(exit_code, head)


def _kill_descendants(child: SupervisedProcess) -> None:
    pid = getattr(child, "pid", None)
    if not isinstance(pid, int) or child.returncode is not None:
        return  # reaped: its orphans belong to init now, out of reach
    for _ in range(_KILL_ROUNDS):
        found = descendants(pid)
        if not found:
            return
        for descendant in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(descendant, signal.SIGKILL)


def descendants(root: int) -> list[int]:
    """The pids whose parent chain leads to ``root`` (not ``root`` itself), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if state == "Z":  # dead already, waiting for its parent to reap it
            continue
        children.setdefault(int(ppid), []).append(int(entry))
    found: list[int] = []
    frontier = [root]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found.extend(kids)
        frontier.extend(kids)
    return found
