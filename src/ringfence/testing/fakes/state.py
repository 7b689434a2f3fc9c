"""Sandbox state on the fake runtime: checkpoints are plain copies of the sandbox's private
home directory, freeze is ``SIGSTOP`` of its processes, an export is a copy sealed with an
HMAC. Enough for tests of the logic above the runtime (pause, resume, fork, snapshots);
nothing here is the local backend's engine, and nothing here isolates anything.

What it captures: ``/home/user`` (the fake's only private directory). What it does not:
anything else the daemon's commands write (the host's ``/tmp``, say), nor process memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from ringfence.backends import Checkpoint, StateSupport, Usage
from ringfence.backends.daemon_sandbox import DaemonSandbox
from ringfence.backends.proc_usage import cpu_seconds_of, disk_bytes_of, resident_bytes_of
from ringfence.errors import CheckpointNotFound, SandboxError, SandboxNotRunning, StateUnsupported
from ringfence.models import ExecutionResult

__all__ = ["FakeStatefulSandbox", "restore_into", "seal_export"]

_SEAL = "seal"
_FILES = "files"


class FakeStatefulSandbox:
    """A fake sandbox (its ``DaemonSandbox``) with its state methods (see the module
    docstring): ``home`` is its private home, ``pids`` gives the processes to freeze."""

    def __init__(
        self,
        sandbox: DaemonSandbox,
        home: Path,
        pids: Callable[[], list[int]],  # its processes now (the tree changes)
        key: bytes,
        *,
        freezer: bool = True,
    ) -> None:
        self._sandbox = sandbox
        self._home = home
        self._pids = pids
        self._key = key
        self._freezer = freezer
        self._held = Path(tempfile.mkdtemp(prefix="rf-fake-ck-"))
        self._checkpoints: dict[str, Checkpoint] = {}
        self.frozen = False

    @property
    def socket_path(self) -> Path:
        return self._sandbox.socket_path

    @property
    def running(self) -> bool:
        return self._sandbox.running

    async def set_timeout(self, seconds: float) -> None:
        await self._sandbox.set_timeout(seconds)

    async def kill(self) -> ExecutionResult:
        try:
            return await self._sandbox.kill()
        finally:
            shutil.rmtree(self._held, ignore_errors=True)

    async def ended(self) -> ExecutionResult:
        try:
            return await self._sandbox.ended()
        finally:
            shutil.rmtree(self._held, ignore_errors=True)

    @property
    def state(self) -> StateSupport:
        missing = () if self._freezer else ("the fake was made without a freezer",)
        return StateSupport(checkpoints=True, freeze=self._freezer, memory=False, missing=missing)

    async def checkpoint(self) -> Checkpoint:
        self._check_running()
        checkpoint_id = "ck" + secrets.token_hex(8)
        target = self._held / checkpoint_id
        shutil.copytree(self._home, target, symlinks=True)
        files = sum(len(d) + len(f) for _, d, f in os.walk(target))
        size = sum(
            p.stat().st_size for p in target.rglob("*") if p.is_file() and not p.is_symlink()
        )
        checkpoint = Checkpoint(checkpoint_id, datetime.now(UTC), files, size)
        self._checkpoints[checkpoint_id] = checkpoint
        return checkpoint

    def checkpoints(self) -> list[Checkpoint]:
        return list(self._checkpoints.values())

    async def rollback(self, checkpoint_id: str) -> None:
        self._check_running()
        source = self._held / self._known(checkpoint_id)
        for entry in list(self._home.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        shutil.copytree(source, self._home, symlinks=True, dirs_exist_ok=True)

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        shutil.rmtree(self._held / self._known(checkpoint_id))
        del self._checkpoints[checkpoint_id]

    async def freeze(self) -> None:
        if not self._freezer:
            raise StateUnsupported("sandbox state cannot be captured: the fake has no freezer")
        self._check_running()
        self._signal(signal.SIGSTOP)
        await asyncio.to_thread(_wait_stopped, self._pids())  # a signal lands later
        self.frozen = True

    async def thaw(self) -> None:
        if self.frozen:
            self._signal(signal.SIGCONT)
            self.frozen = False

    async def export(self, checkpoint_id: str, target: Path) -> None:
        source = self._held / self._known(checkpoint_id)
        target.mkdir(mode=0o700, parents=False)
        shutil.copytree(source, target / _FILES, symlinks=True)
        seal_export(target, self._key)

    async def usage(self) -> Usage:
        """Its processes' CPU time and resident memory (from ``/proc``: what exited
        unreaped is lost), its home's bytes as its disk; no limits (the fake applies
        none)."""
        self._check_running()

        def read() -> Usage:
            pids = self._pids()
            return Usage(
                cpu_seconds=cpu_seconds_of(pids),
                cpus=0.0,
                memory_bytes=resident_bytes_of(pids),
                memory_limit=0,
                disk_bytes=disk_bytes_of(self._home),
                disk_limit=0,
                pids=len(pids),
            )

        return await asyncio.to_thread(read)

    def _known(self, checkpoint_id: str) -> str:
        if checkpoint_id not in self._checkpoints:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id!r} of this sandbox")
        return checkpoint_id

    def _check_running(self) -> None:
        if not self.running:
            raise SandboxNotRunning("the sandbox has ended")

    def _signal(self, signum: int) -> None:
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def _wait_stopped(pids: list[int]) -> None:
    """Return once every one of ``pids`` is stopped (or gone), as a freezer does: ``kill``
    returns before the signal has stopped a process running on another core.

    Raises:
        SandboxError: one did not stop within 2 s.
    """
    deadline = time.monotonic() + 2
    for pid in pids:
        while _run_state(pid) not in ("T", "t", "Z", "X", None):
            if time.monotonic() > deadline:
                raise SandboxError(f"process {pid} did not stop within 2 s")
            time.sleep(0.001)


def _run_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # gone
    return stat.rpartition(")")[2].split()[0]


def seal_export(target: Path, key: bytes) -> None:
    """Write ``target``'s seal: an HMAC of every entry's path, kind and content."""
    (target / _SEAL).write_text(_digest(target / _FILES, key))


def restore_into(source: Path, home: Path, key: bytes) -> None:
    """Copy an export's files into ``home``, after checking its seal.

    Raises:
        SandboxError: ``source`` is no export sealed with ``key`` (tampered, or foreign).
    """
    try:
        seal = (source / _SEAL).read_text()
    except OSError as exc:
        raise SandboxError(f"no sealed snapshot at {source}: {exc.strerror}") from exc
    if not hmac.compare_digest(seal, _digest(source / _FILES, key)):
        raise SandboxError("the snapshot's seal does not match its files: refused")
    shutil.copytree(source / _FILES, home, symlinks=True, dirs_exist_ok=True)


def _digest(root: Path, key: bytes) -> str:
    entries = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(directory, name)
            relative = str(path.relative_to(root))
            if path.is_symlink():
                entries.append([relative, "link", os.readlink(path)])
            elif path.is_dir():
                entries.append([relative, "dir", ""])
            else:
                entries.append([relative, "file", hashlib.sha256(path.read_bytes()).hexdigest()])
    return hmac.new(key, json.dumps(entries).encode(), hashlib.sha256).hexdigest()
