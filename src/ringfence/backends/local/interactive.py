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

When Ringfence is host root, the daemon runs as root inside (``userns``: ns 0 with Docker's
capabilities, in a user namespace that maps it and the sandbox user to two host uids of the
sandbox's own) and is told so (``--root``): commands run as the sandbox user by default and
as root when asked. Otherwise it runs as the sandbox user and serves only that one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import py_compile
import secrets
import shutil
import uuid
import weakref
from pathlib import Path

import ringfence.sandboxd
from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.daemon_sandbox import listen, start_daemon_sandbox
from ringfence.backends.local.backend import LocalExecutor, Populate
from ringfence.backends.local.bwrap import DEFAULT_PATH
from ringfence.backends.local.rootfs import materialize
from ringfence.backends.local.sandbox import LocalSandbox, layers_of
from ringfence.backends.local.snapshots import Budget, populate
from ringfence.backends.local.volume import Volume
from ringfence.config import Config
from ringfence.models import ExecutionRequest, Mount

__all__ = ["DAEMON_PARENT", "LocalSandboxRuntime", "prepare_daemon"]

log = logging.getLogger(__name__)

DAEMON_PARENT = "/run/ringfence"  # inside the sandbox: the package is DAEMON_PARENT/sandboxd
SUDO_DIR = f"{DAEMON_PARENT}/bin"  # inside the sandbox, first in PATH: only ``sudo`` is there
_PYTHON = "/usr/bin/python3"
# How long a sandbox may take from "start" to its daemon running, before create fails.
_START_SECONDS = 10.0


class LocalSandboxRuntime:
    """Starts interactive sandboxes with the local backend."""

    def __init__(
        self, executor: LocalExecutor, config: Config, seal_key: bytes | None = None
    ) -> None:
        """``seal_key``: the server's key that seals exported snapshots (and is checked
        before one is restored); None: a random one for this process only (its exports
        restore in no other process). Raises ``OSError`` when the runtime directory cannot
        be prepared."""
        self._executor = executor
        self._seal_key = seal_key if seal_key is not None else secrets.token_bytes(32)
        self._budget = Budget(count=config.max_checkpoints, bytes=config.checkpoint_bytes)
        self._sandboxes: weakref.WeakSet[LocalSandbox] = weakref.WeakSet()
        sockets = config.runtime_dir / "sockets"
        sockets.mkdir(mode=0o700, parents=True, exist_ok=True)
        _sweep_stale_instances(sockets)
        self._sockets = sockets / f"i{os.getpid()}"
        self._sockets.mkdir(mode=0o700, exist_ok=True)
        self._daemon = prepare_daemon(config.runtime_dir)

    async def start(self, spec: LaunchSpec) -> LocalSandbox:
        """Start a sandbox running the daemon, on a volume filled from ``spec.restore``
        when given; return once its init runs (the daemon may still be starting: its first
        request waits in the socket's backlog).

        Raises:
            SandboxError: the sandbox could not be set up (the message says why), or
                ``spec.restore`` is not an export sealed with this runtime's key, or was
                changed (nothing of it is used then).
            StateUnsupported: ``spec.restore`` or ``spec.volumes`` given, but sandboxes get
                no volume here.
            SandboxUidsExhausted: every host uid for sandboxes is taken; nothing started.
        """
        run_id = uuid.uuid4().hex  # the daemon's execution: no tenant sees it
        socket_path = self._sockets / f"{run_id}.sock"
        listener = listen(socket_path)
        request = ExecutionRequest(
            id=run_id,
            image=spec.image,
            command=[_PYTHON, "-I", "-S", "-B", "-c", _BOOT],
            args=["--listen-fd", str(listener.fileno()), *self._root_flag()],
            env=self._env(spec.env),
            timeout=spec.timeout,
            limits=spec.limits,
            mounts=self._daemon_mounts(),
            network=spec.network,
        )
        try:
            shared = [(bound.source, bound.target, bound.read_only) for bound in spec.volumes]
            self._executor.reserve(run_id, self._populate(spec.restore), shared, spec.project)
            inner = await start_daemon_sandbox(
                self._executor, request, listener, socket_path, _START_SECONDS
            )
            parts = self._executor.parts(run_id)
        finally:
            self._executor.unreserve(run_id)
            listener.close()  # start_daemon_sandbox closed it unless reserve refused
        missing = self._executor.state_missing
        sandbox = LocalSandbox(inner, parts, self._budget, self._seal_key, missing)
        self._sandboxes.add(sandbox)
        return sandbox

    def _populate(self, export: Path | None) -> Populate | None:
        """What fills a fresh volume from ``export`` (its seal and every file checked
        first: ``SandboxError`` refuses the start); None: nothing to restore."""
        if export is None:
            return None
        key = self._seal_key

        def fill(volume: Volume) -> None:
            populate(export, layers_of(volume), volume.owners, key)

        return fill

    def _daemon_mounts(self) -> list[Mount]:
        """The daemon's package, and with root inside its ``sudo`` (sandboxd/_sudo.py)."""
        mounts = [Mount(source=str(self._daemon), target=f"{DAEMON_PARENT}/sandboxd")]
        if self._executor.can_run_root_inside:
            mounts.append(Mount(source=str(self._daemon / "sudo"), target=f"{SUDO_DIR}/sudo"))
        return mounts

    def _env(self, env: dict[str, str]) -> dict[str, str]:
        """``env``, with ``sudo``'s directory first in PATH where there is a sudo: the
        template's own ``/usr/bin/sudo`` cannot work in a sandbox (every mount is nosuid)."""
        if not self._executor.can_run_root_inside:
            return env
        return {**env, "PATH": f"{SUDO_DIR}:{env.get('PATH', DEFAULT_PATH)}"}

    def _root_flag(self) -> list[str]:
        """The daemon runs as root inside (and serves ``root``) where the executor maps it:
        every sandbox it reserves, when Ringfence is host root."""
        return ["--root"] if self._executor.can_run_root_inside else []

    async def aclose(self) -> None:
        await self._executor.aclose()
        for sandbox in list(self._sandboxes):  # each lets go of its store once it has ended
            await sandbox.released()
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
    # The daemon and the browser agent (sandboxd/browser: started through the daemon; its
    # page scripts may be files of their own, .js).
    sources = sorted([
        *package.glob("*.py"), *package.glob("*.js"), *package.glob("*.conf"), package / "sudo",
        *(package / "browser").glob("*.py"), *(package / "browser").glob("*.js"),
    ])  # fmt: skip
    digest = hashlib.sha256()
    for source in sources:
        name = source.relative_to(package).as_posix()
        digest.update(name.encode() + b"\0" + source.read_bytes() + b"\0")

    def build(directory: Path) -> None:
        target = directory / "sandboxd"
        target.mkdir()
        (target / "browser").mkdir()
        for source in sources:
            copy = target / source.relative_to(package)
            shutil.copy2(source, copy)
            copy.chmod(0o644)
            if source.suffix != ".py":
                continue
            # Bytecode for the host's python3 (the "base" template's): the sandbox reads it
            # but cannot write it, and compiling at every start would cost milliseconds.
            # Unchecked: the copy never changes (its directory is named by its digest).
            py_compile.compile(
                str(copy),
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
            )
        for path in [target, *target.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or path.name == "sudo" else 0o644)

    return materialize(runtime_dir, "sandboxd", digest, build) / "sandboxd"


def _sweep_stale_instances(sockets: Path) -> None:
    """Remove the socket directories of Ringfence processes that are gone (their sandboxes
    died with them)."""
    for instance in sockets.iterdir():
        pid = instance.name[1:]
        if instance.name.startswith("i") and pid.isdigit() and not Path("/proc", pid).exists():
            shutil.rmtree(instance, ignore_errors=True)
