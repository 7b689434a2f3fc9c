"""Interactive sandboxes on the local backend: one long execution of the sandbox daemon.

An interactive sandbox is a ``LocalExecutor`` execution whose command is the daemon
(``ringfence.sandboxd``, standard-library Python run by the sandbox's own python3), with
every isolation layer of a one-shot execution and a deadline that ``set_timeout`` moves.

How the host reaches the daemon: the host binds a unix socket in a directory only its own
user may enter and hands the *listening* descriptor to the daemon, which never binds
anything. The socket's path exists only on the host: nothing inside the sandbox can reach it
(there is no network, and the path is not mounted), and no other local user can connect to
it. The host closes its copy once the sandbox has started, so when the daemon dies a connect
fails at once instead of waiting in the backlog.

The package is copied (with its bytecode) under the runtime directory, which the
unprivileged sandbox user can traverse, and bound read-only at ``/run/ringfence/sandboxd``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import py_compile
import shutil
import uuid
from pathlib import Path

import ringfence.sandboxd
from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.daemon_sandbox import DaemonSandbox, listen, start_daemon_sandbox
from ringfence.backends.local.backend import LocalExecutor
from ringfence.backends.local.rootfs import materialize
from ringfence.config import Config
from ringfence.models import ExecutionRequest, Mount

__all__ = ["DAEMON_PARENT", "LocalSandboxRuntime", "prepare_daemon"]

log = logging.getLogger(__name__)

DAEMON_PARENT = "/run/ringfence"  # inside the sandbox: the package is DAEMON_PARENT/sandboxd
_PYTHON = "/usr/bin/python3"
# How long a sandbox may take from "start" to its daemon running, before create fails.
_START_SECONDS = 10.0


class LocalSandboxRuntime:
    """Starts interactive sandboxes with the local backend."""

    def __init__(self, executor: LocalExecutor, config: Config) -> None:
        """Raises ``OSError`` when the runtime directory cannot be prepared."""
        self._executor = executor
        sockets = config.runtime_dir / "sockets"
        sockets.mkdir(mode=0o700, parents=True, exist_ok=True)
        _sweep_stale_instances(sockets)
        self._sockets = sockets / f"i{os.getpid()}"
        self._sockets.mkdir(mode=0o700, exist_ok=True)
        self._daemon = prepare_daemon(config.runtime_dir)

    async def start(self, spec: LaunchSpec) -> DaemonSandbox:
        """Start a sandbox running the daemon; return once its init runs (the daemon may
        still be starting: its first request waits in the socket's backlog).

        Raises:
            SandboxError: the sandbox could not be set up (the message says why).
            SandboxUidsExhausted: every host uid for sandboxes is taken; nothing started.
        """
        run_id = uuid.uuid4().hex  # the daemon's execution: no tenant sees it
        socket_path = self._sockets / f"{run_id}.sock"
        listener = listen(socket_path)
        request = ExecutionRequest(
            id=run_id,
            image=spec.image,
            command=[_PYTHON, "-I", "-S", "-B", "-c", _BOOT],
            args=["--listen-fd", str(listener.fileno())],
            env=spec.env,
            timeout=spec.timeout,
            limits=spec.limits,
            mounts=[Mount(source=str(self._daemon), target=f"{DAEMON_PARENT}/sandboxd")],
            network=spec.network,
        )
        if not self._executor.state_missing:
            self._executor.reserve_volume(run_id)
        try:
            return await start_daemon_sandbox(
                self._executor, request, listener, socket_path, _START_SECONDS
            )
        finally:
            self._executor.unreserve(run_id)

    async def aclose(self) -> None:
        await self._executor.aclose()
        shutil.rmtree(self._sockets, ignore_errors=True)


_BOOT = f"import sys; sys.path.insert(0, {DAEMON_PARENT!r}); import sandboxd.__main__"


def prepare_daemon(runtime_dir: Path) -> Path:
    """A world-readable copy of the daemon's package, compiled, under ``runtime_dir``.

    Its directory is named by a digest of the sources, so a running sandbox's copy never
    changes under it. Returns the package directory.

    Raises:
        OSError: the runtime directory cannot be written.
    """
    package = Path(ringfence.sandboxd.__file__).parent
    sources = sorted([*package.glob("*.py"), *package.glob("*.js")])
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")

    def build(directory: Path) -> None:
        target = directory / "sandboxd"
        target.mkdir()
        for source in sources:
            shutil.copy2(source, target / source.name)
            (target / source.name).chmod(0o644)
            if source.suffix != ".py":
                continue
            # Bytecode for the host's python3 (the "base" template's): the sandbox reads it
            # but cannot write it, and compiling at every start would cost milliseconds.
            # Unchecked: the copy never changes (its directory is named by its digest).
            py_compile.compile(
                str(target / source.name),
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
            )
        for path in [target, *target.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)

    return materialize(runtime_dir, "sandboxd", digest, build) / "sandboxd"


def _sweep_stale_instances(sockets: Path) -> None:
    """Remove the socket directories of Ringfence processes that are gone (their sandboxes
    died with them)."""
    for instance in sockets.iterdir():
        pid = instance.name[1:]
        if instance.name.startswith("i") and pid.isdigit() and not Path("/proc", pid).exists():
            shutil.rmtree(instance, ignore_errors=True)
