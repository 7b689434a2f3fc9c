"""The local sandbox's state (``backends/local/sandbox.py``) on real sandboxes: checkpoints
of the workspace, /tmp and the root's upper layers, rollback in place with processes
surviving, freeze and thaw, exports restored into a new sandbox (and a tampered one
refused), and symlinks the sandbox plants never followed."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.backends.local.probe import Host, require
from ringfence.backends.local.sandbox import LocalSandbox
from ringfence.backends.local.snapshots import RestoreIncomplete
from ringfence.config import Config
from ringfence.errors import (
    CheckpointNotFound,
    SandboxError,
    SandboxNotRunning,
    StateUnsupported,
)
from ringfence.models import ResourceLimits
from ringfence.testing.backend_checks import run_in_sandbox

pytestmark = pytest.mark.integration

KEY = b"k" * 32
# What the test compares: every file under these, with its type, mode, owner and content.
LISTING = r"""
import hashlib, os, stat, sys
for top in ("/home/user", "/tmp", "/usr/lib/rf", "/etc/rf", "/usr/bin/zcat",
            "/usr/lib/python3.11/os.py"):
    paths = [top]
    if os.path.isdir(top) and not os.path.islink(top):
        for root, dirs, files in os.walk(top):
            paths += [os.path.join(root, n) for n in sorted(dirs + files)]
    for path in sorted(paths):
        if path.endswith("/beat"):
            continue
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            print(path, "absent"); continue
        what = ""
        if stat.S_ISREG(st.st_mode):
            what = hashlib.sha256(open(path, "rb").read()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            what = os.readlink(path)
        print(path, oct(st.st_mode), st.st_uid, st.st_gid, what)
"""


@pytest.fixture
async def runtime(local_host: Host) -> AsyncIterator[LocalSandboxRuntime]:
    if not local_host.volumes:
        pytest.skip(f"no volumes on this host: {'; '.join(local_host.state_missing)}")
    config = Config()  # the default runtime directory: uids are claimed host-wide there
    built = LocalSandboxRuntime(LocalExecutor(config, host=local_host), config, seal_key=KEY)
    yield built
    await built.aclose()


def _spec(restore: Path | None = None) -> LaunchSpec:
    limits = ResourceLimits(disk=64 << 20)
    return LaunchSpec(image="host", env={}, limits=limits, timeout=120, restore=restore)


async def _sh(sandbox: LocalSandbox, script: str) -> str:
    """As root inside: the scripts change the root's directories, which only root may."""
    output, code = await run_in_sandbox(sandbox, "sh", "-c", script, user="root")
    assert code == 0, (script, output)
    return output


async def _listing(sandbox: LocalSandbox) -> str:
    return await _sh(sandbox, f"python3 -c '{LISTING}'")


async def _start_beating(sandbox: LocalSandbox) -> int:
    """A process started before any checkpoint, writing /tmp/beat in a loop; its pid."""
    out = await _sh(
        sandbox,
        "setsid sh -c 'n=0; while :; do n=$((n+1)); echo $n > /tmp/beat; sleep 0.01; done' "
        ">/dev/null 2>&1 < /dev/null & echo $!; "
        "for i in $(seq 500); do [ -s /tmp/beat ] && break; sleep 0.01; done",
    )
    return int(out.strip())


async def _beat_advances(sandbox: LocalSandbox) -> bool:
    out = await _sh(sandbox, "a=$(cat /tmp/beat); sleep 0.2; b=$(cat /tmp/beat); echo $a $b")
    first, second = out.split()
    return int(second) > int(first)


SETUP = (
    "mkdir -p /home/user/d/deep /usr/lib/rf /etc/rf && "
    "echo one > /home/user/a && head -c 100000 /dev/urandom > /home/user/d/deep/blob && "
    "echo keep > /home/user/d/b && ln -s a /home/user/link && chmod 0600 /home/user/d/b && "
    "echo tmp > /tmp/t && echo lib > /usr/lib/rf/x && echo conf > /etc/rf/c && "
    "echo '# changed' >> /usr/lib/python3.11/os.py && rm /usr/bin/zcat"
)
CHANGES = (
    "echo two > /home/user/a && rm -r /home/user/d && echo new > /home/user/new && "
    "rm /tmp/t && echo other > /tmp/u && rm -r /usr/lib/rf && mkdir /usr/lib/rf && "
    "echo made > /usr/lib/rf/y && echo again > /etc/rf/c && echo zcat > /usr/bin/zcat && "
    "echo '# twice' >> /usr/lib/python3.11/os.py && rm -f /home/user/link && "
    "ln -s /etc/shadow /home/user/link"
)


async def test_rollback_restores_every_layer_byte_identical_and_processes_survive(
    runtime: LocalSandboxRuntime,
) -> None:
    sandbox = await runtime.start(_spec())
    try:
        assert sandbox.state.checkpoints and sandbox.state.freeze
        assert not sandbox.state.memory
        beating = await _start_beating(sandbox)
        await _sh(sandbox, SETUP)
        before = await _listing(sandbox)
        checkpoint = await sandbox.checkpoint()
        assert [c.id for c in sandbox.checkpoints()] == [checkpoint.id]
        await _sh(sandbox, CHANGES)
        assert await _listing(sandbox) != before
        started = time.perf_counter()
        await sandbox.rollback(checkpoint.id)
        took = time.perf_counter() - started
        assert await _listing(sandbox) == before, "byte-identical, made ones gone"
        await _sh(sandbox, f"kill -0 {beating}")
        assert await _beat_advances(sandbox), "the process from before runs on"
        assert took < 5, took
        # A second rollback to the same checkpoint, after more changes, again.
        await _sh(sandbox, CHANGES)
        await sandbox.rollback(checkpoint.id)
        assert await _listing(sandbox) == before
        with pytest.raises(CheckpointNotFound):
            await sandbox.rollback("ck0000")
        await sandbox.delete_checkpoint(checkpoint.id)
        assert sandbox.checkpoints() == []
    finally:
        await sandbox.kill()


async def test_freeze_stops_every_process_until_thaw(runtime: LocalSandboxRuntime) -> None:
    sandbox = await runtime.start(_spec())
    try:
        await _start_beating(sandbox)
        parts = runtime._executor.parts(sandbox._inner._run_id)  # the host's view of /tmp
        assert parts is not None and parts.volume is not None
        beat = parts.volume.tmp / "beat"
        await sandbox.freeze()
        held = beat.read_text()
        await asyncio.sleep(0.2)
        assert beat.read_text() == held, "frozen: nothing runs"
        checkpoint = await sandbox.checkpoint()  # while paused: it stays paused after
        await asyncio.sleep(0.1)
        assert beat.read_text() == held
        await sandbox.thaw()
        assert await _beat_advances(sandbox)
        assert checkpoint.files > 0
        await sandbox.freeze()
        async with asyncio.timeout(10):
            await sandbox.kill()  # a frozen sandbox dies too, and nothing of it is left
        assert not sandbox.running and parts.cgroup.pids() == []
        assert not parts.volume.path.exists()
        with pytest.raises(SandboxNotRunning):
            await sandbox.checkpoint()
        assert sandbox.checkpoints() == [], "they went with its volume"
        await _until(lambda: not _holds_a_detached_volume(), "its store lets the tmpfs go")
    finally:
        await sandbox.kill()


def _holds_a_detached_volume() -> bool:
    """Whether this process still has a descriptor into an unmounted volume (it would keep
    the whole tmpfs, and its memory, alive)."""
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/snapshots"):
                return True
    return False


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within 2 s: {what}")


async def test_a_new_sandbox_starts_from_an_export_and_a_tampered_one_is_refused(
    runtime: LocalSandboxRuntime, tmp_path: Path
) -> None:
    sandbox = await runtime.start(_spec())
    try:
        await _sh(sandbox, SETUP)
        before = await _listing(sandbox)
        checkpoint = await sandbox.checkpoint()
        await sandbox.export(checkpoint.id, tmp_path / "export")
    finally:
        await sandbox.kill()
    restored = await runtime.start(_spec(restore=tmp_path / "export"))
    try:
        assert await _listing(restored) == before
    finally:
        await restored.kill()
    blob = max(
        (p for p in (tmp_path / "export").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(SandboxError):
        await runtime.start(_spec(restore=tmp_path / "export"))


async def test_symlinks_the_sandbox_plants_are_never_followed(
    runtime: LocalSandboxRuntime, open_tmp: Path
) -> None:
    secret = open_tmp / "host-secret"
    secret.write_text("host secret")
    secret.chmod(0o644)
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    victim = await runtime.start(_spec())
    sandbox = await runtime.start(_spec())
    try:
        parts = runtime._executor.parts(victim._inner._run_id)
        assert parts is not None and parts.volume is not None
        other = parts.volume.workspace
        await _sh(victim, "echo mine > /home/user/file")
        await _sh(
            sandbox,
            f"mkdir -p /home/user/d && echo x > /home/user/d/f && ln -s {secret} /home/user/s && "
            f"ln -s {other} /home/user/other && ln -s {secret} /usr/lib/rf-s && "
            f"ln -s {secret} /tmp/s",
        )
        checkpoint = await sandbox.checkpoint()
        # Between checkpoint and rollback a directory becomes a link to the host and to
        # the other sandbox's workspace: the rollback writes into neither.
        await _sh(
            sandbox,
            f"rm -r /home/user/d && ln -s {open_tmp} /home/user/d && "
            f"rm /home/user/other && mkdir /home/user/other && ln -s {other} /tmp/t",
        )
        await sandbox.rollback(checkpoint.id)
        out = await _sh(sandbox, "cat /home/user/d/f; readlink /home/user/s /home/user/other")
        assert out.split() == ["x", str(secret), str(other)]
        export = open_tmp / "export"
        await sandbox.export(checkpoint.id, export)
        assert not any(
            b"host secret" in p.read_bytes() for p in export.rglob("*") if p.is_file()
        ), "a link is exported as a link, never as what it points to"
    finally:
        await sandbox.kill()
    try:
        assert hashlib.sha256(secret.read_bytes()).hexdigest() == digest
        assert sorted(os.listdir(open_tmp)) == ["export", "host-secret"]
        assert (other / "file").read_text() == "mine\n" and os.listdir(other) == ["file"]
    finally:
        await victim.kill()


async def test_without_overlays_a_sandbox_says_why_it_has_no_state_and_still_freezes(
    tmp_path: Path,
) -> None:
    config = Config(bwrap_path="/usr/bin/bwrap")  # Debian's 0.8: no overlays
    host = require(config)
    if host.volumes:
        pytest.skip("/usr/bin/bwrap has overlays here")
    runtime = LocalSandboxRuntime(LocalExecutor(config, host=host), config, seal_key=KEY)
    try:
        with pytest.raises(StateUnsupported):
            await runtime.start(_spec(restore=tmp_path))
        sandbox = await runtime.start(_spec())
        try:
            state = sandbox.state
            assert not state.checkpoints and state.freeze
            assert any("overlays" in reason for reason in state.missing), state.missing
            with pytest.raises(StateUnsupported):
                await sandbox.checkpoint()
            assert await _sh(sandbox, "touch /usr/x 2>&1 || echo refused") == (
                "touch: cannot touch '/usr/x': Read-only file system\nrefused\n"
            )
            await sandbox.freeze()
            await sandbox.thaw()
            assert await _sh(sandbox, "echo alive") == "alive\n"
        finally:
            await sandbox.kill()
    finally:
        await runtime.aclose()


async def test_a_rollback_failing_part_way_kills_the_sandbox_frozen_never_thawing_it(
    runtime: LocalSandboxRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = await runtime.start(_spec())
    try:
        await _start_beating(sandbox)
        checkpoint = await sandbox.checkpoint()
        parts = runtime._executor.parts(sandbox._inner._run_id)
        assert parts is not None and parts.volume is not None and sandbox._store is not None
        thawed: list[bool] = []
        real_thaw = parts.cgroup.thaw
        monkeypatch.setattr(parts.cgroup, "thaw", lambda: (thawed.append(True), real_thaw()))
        beat = parts.volume.tmp / "beat"
        at_failure: list[str] = []

        def restore_half(checkpoint_id: str, overlay_view: object = None) -> None:
            (parts.volume.workspace / "half").write_text("mixed")  # a first write
            at_failure.append(beat.read_text())
            raise RestoreIncomplete("the volume is full (a copy of 'big' failed)")

        monkeypatch.setattr(sandbox._store, "restore", restore_half)
        with pytest.raises(SandboxError, match=r"failed part way.*killed"):
            await sandbox.rollback(checkpoint.id)
        assert thawed == [], "never thawed into mixed files"
        assert not sandbox.running and parts.cgroup.pids() == []
        ended = await sandbox.ended()
        assert ended.status.value == "failed"
        assert ended.error == (
            "rollback failed part way: the volume is full (a copy of 'big' failed)"
        )
        assert at_failure and at_failure[0].strip().isdigit()
    finally:
        await sandbox.kill()


async def test_a_refused_rollback_thaws_and_the_sandbox_runs_on(
    runtime: LocalSandboxRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = await runtime.start(_spec())
    try:
        await _start_beating(sandbox)
        with pytest.raises(CheckpointNotFound):
            await sandbox.rollback("ck0000")
        assert sandbox.running and await _beat_advances(sandbox)
        checkpoint = await sandbox.checkpoint()
        assert sandbox._store is not None

        def refuse(checkpoint_id: str, overlay_view: object = None) -> None:
            raise SandboxError("/usr in the sandbox is not its overlay")  # before any write

        monkeypatch.setattr(sandbox._store, "restore", refuse)
        with pytest.raises(SandboxError, match="not its overlay"):
            await sandbox.rollback(checkpoint.id)
        assert sandbox.running and await _beat_advances(sandbox)
    finally:
        await sandbox.kill()


async def test_a_kill_during_a_checkpoint_does_not_hide_its_error(
    runtime: LocalSandboxRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = await runtime.start(_spec())
    try:
        parts = runtime._executor.parts(sandbox._inner._run_id)
        assert parts is not None and sandbox._store is not None

        def killed_meanwhile() -> None:
            parts.cgroup.remove()  # what a kill does under the operation's feet
            raise SandboxError("the take failed on its own")

        monkeypatch.setattr(sandbox._store, "take", killed_meanwhile)
        with pytest.raises(SandboxError, match="the take failed on its own"):
            await sandbox.checkpoint()
    finally:
        await sandbox.kill()


async def test_freeze_thaw_and_delete_run_off_the_event_loop(
    runtime: LocalSandboxRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = await runtime.start(_spec())
    try:
        parts = runtime._executor.parts(sandbox._inner._run_id)
        assert parts is not None and sandbox._store is not None
        loop_thread = threading.get_ident()
        ran_in: dict[str, int] = {}

        def spy(name: str, real: Callable[..., object]) -> Callable[..., object]:
            def called(*args: object) -> object:
                ran_in[name] = threading.get_ident()
                return real(*args)

            return called

        monkeypatch.setattr(parts.cgroup, "freeze", spy("freeze", parts.cgroup.freeze))
        monkeypatch.setattr(parts.cgroup, "thaw", spy("thaw", parts.cgroup.thaw))
        monkeypatch.setattr(sandbox._store, "delete", spy("delete", sandbox._store.delete))
        checkpoint = await sandbox.checkpoint()
        await sandbox.freeze()
        await sandbox.thaw()
        await sandbox.delete_checkpoint(checkpoint.id)
        assert set(ran_in) == {"freeze", "thaw", "delete"}
        assert loop_thread not in ran_in.values(), ran_in
    finally:
        await sandbox.kill()
