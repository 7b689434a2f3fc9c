"""Sandboxes on a volume (``backends/local/volume.py``): a writable root whose writes land in
the sandbox's own layer, one disk limit over everything it writes, nothing left behind,
and nothing of one volume reachable from another sandbox. Real sandboxes, as root."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.backends.local._mounts import mount_tmpfs, mounts_under
from ringfence.backends.local.probe import Host
from ringfence.backends.local.volume import BYTES_PER_INODE, MIN_INODES, VOLUMES, Volumes
from ringfence.config import Config
from ringfence.models import ExecutionRequest, ExecutionResult, ResourceLimits, Status

pytestmark = pytest.mark.integration

PYTHON_OS = Path("/usr/lib/python3.11/os.py")


@pytest.fixture
def host(local_host: Host) -> Host:
    if not local_host.volumes:
        pytest.skip(f"no volumes on this host: {'; '.join(local_host.state_missing)}")
    return local_host


@pytest.fixture
async def executor(host: Host) -> AsyncIterator[LocalExecutor]:
    # The default runtime directory: sandbox uids are claimed host-wide there.
    config = Config(checkpoint_bytes=1 << 20)
    built = LocalExecutor(config, host=host)
    yield built
    await built.aclose()


def _ours(executor: LocalExecutor) -> Path:
    """This process's volumes (other servers on the host have theirs beside them)."""
    return executor.config.runtime_dir / VOLUMES / f"i{os.getpid()}"


def _volumes_mounted(executor: LocalExecutor) -> list[str]:
    """The mounts under this process's volumes directory (itself, an unbindable mount
    point of its own, aside)."""
    ours = str(_ours(executor).resolve())
    return [point for point in mounts_under(ours) if point != ours]


def _sh(script: str, disk: int | None = None) -> ExecutionRequest:
    limits = ResourceLimits(disk=disk) if disk else ResourceLimits()
    return ExecutionRequest(command=["sh", "-c", script], limits=limits)


async def _on_volume(executor: LocalExecutor, request: ExecutionRequest) -> ExecutionResult:
    executor.reserve(request.id)
    try:
        return await executor.execute(request)
    finally:
        executor.unreserve(request.id)


@contextlib.asynccontextmanager
async def _running(
    executor: LocalExecutor, request: ExecutionRequest, ready: str = "ready"
) -> AsyncIterator[asyncio.Task[ExecutionResult]]:
    """Run ``request`` on a volume until it prints ``ready``; cancel it on exit."""
    seen = bytearray()
    printed = asyncio.Event()

    def output(chunk: bytes) -> None:
        seen.extend(chunk)
        if ready.encode() in seen:
            printed.set()

    executor.reserve(request.id)
    task = asyncio.create_task(executor.execute(request, on_output=output))
    try:
        await asyncio.wait_for(_first(printed, task), 20)
        assert printed.is_set(), f"it ended first: {(await task).logs}"
        yield task
    finally:
        executor.unreserve(request.id)
        with contextlib.suppress(Exception):
            await executor.cancel(request.id)
        await task


async def _first(event: asyncio.Event, task: asyncio.Task[ExecutionResult]) -> None:
    waiter = asyncio.create_task(event.wait())
    await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()


async def test_the_root_is_writable_and_writes_land_in_the_sandboxs_own_layer(
    executor: LocalExecutor,
) -> None:
    before = PYTHON_OS.read_bytes()
    script = (
        f"echo added >> {PYTHON_OS} && echo new > /usr/lib/rf-new && "
        "mkdir -p /usr/local/lib/rf-pkg && echo conf > /etc/rf.conf && "
        "rm /usr/bin/zcat && echo ready; exec sleep 60"
    )
    request = _sh(script)
    async with _running(executor, request):
        parts = executor.parts(request.id)
        assert parts is not None and parts.volume is not None
        uppers = {layer.target: layer.upper for layer in parts.volume.layers}
        # The command ran as the sandbox's root inside: its writes are its root's host uid.
        sandbox_uid = parts.volume.owners[0]
        assert sandbox_uid != 0 and parts.volume.workspace.stat().st_uid == parts.volume.owners[1]
        for path in (uppers["/usr"] / "lib/rf-new", uppers["/usr"] / "lib/python3.11/os.py"):
            assert path.stat().st_uid == sandbox_uid, "made by the sandbox: its uid, never 0"
        assert (uppers["/etc"] / "rf.conf").read_text() == "conf\n"
        assert (uppers["/usr"] / "local/lib/rf-pkg").is_dir()
        assert os.stat(uppers["/usr"] / "bin/zcat").st_rdev == 0, "a whiteout, in the layer"
        for upper in uppers.values():
            for root, dirs, files in os.walk(upper):
                for name in [root, *dirs, *files]:
                    assert os.lstat(os.path.join(root, name)).st_uid != 0, name
        # Another sandbox sees the template as it is, while the first one still runs.
        other = await _on_volume(
            executor, _sh(f"tail -c 6 {PYTHON_OS}; ls /usr/lib/rf-new /usr/bin/zcat 2>&1; true")
        )
    assert other.status is Status.SUCCEEDED, other.logs
    assert "added" not in other.logs and "No such file" in other.logs
    assert "/usr/bin/zcat" in other.logs.splitlines()[-1]
    assert PYTHON_OS.read_bytes() == before, "the host's file is unchanged"
    assert not Path("/usr/lib/rf-new").exists() and Path("/usr/bin/zcat").exists()


async def test_one_disk_limit_bounds_the_workspace_tmp_and_the_root_together(
    executor: LocalExecutor,
) -> None:
    # 8 MiB of disk + 1 MiB of checkpoint budget: 3 + 3 fit, the next 4 do not.
    script = (
        "dd if=/dev/zero of=/home/user/a bs=1M count=3 2>/dev/null && "
        "dd if=/dev/zero of=/tmp/b bs=1M count=3 2>/dev/null && "
        "dd if=/dev/zero of=/usr/c bs=1M count=4 2>&1 | head -1; "
        "df -k /home/user | tail -1; "
        "dd if=/dev/zero of=/dev/shm/d bs=1M count=6 2>/dev/null && echo shm-separate"
    )
    result = await _on_volume(executor, _sh(script, disk=8 << 20))
    assert "No space left on device" in result.logs, result.logs
    assert "shm-separate" in result.logs, "/dev/shm is its own tmpfs, with its own limit"
    total_kib = int(result.logs.splitlines()[-2].split()[1])
    assert total_kib == 9 << 10


async def test_a_one_shot_execution_gets_no_volume_and_a_read_only_root(
    executor: LocalExecutor,
) -> None:
    result = await executor.execute(_sh("touch /usr/x 2>&1; grep -c overlay /proc/self/mountinfo"))
    assert "Read-only file system" in result.logs
    assert result.logs.splitlines()[-1] == "0"
    assert not list(_ours(executor).glob("rf-*"))


async def test_the_volume_is_unmounted_and_removed_when_the_sandbox_ends(
    executor: LocalExecutor,
) -> None:
    request = _sh("echo ready; exec sleep 60")
    async with _running(executor, request):
        parts = executor.parts(request.id)
        assert parts is not None and parts.volume is not None and parts.volume.path.is_dir()
        assert mounts_under(str(parts.volume.path))
    assert executor.parts(request.id) is None
    assert not _volumes_mounted(executor) and not parts.volume.path.exists()


async def test_another_uid_cannot_enter_a_volume_and_no_sandbox_sees_the_host_paths(
    executor: LocalExecutor,
) -> None:
    request = _sh("echo secret > /home/user/s; echo ready; exec sleep 60")
    async with _running(executor, request):
        parts = executor.parts(request.id)
        assert parts is not None and parts.volume is not None
        other_uid = parts.volume.workspace.stat().st_uid + 1
        peek = subprocess.run(
            ["setpriv", f"--reuid={other_uid}", f"--regid={other_uid}", "--clear-groups",
             "cat", str(parts.volume.workspace / "s")],
            capture_output=True, text=True,
        )  # fmt: skip
        assert peek.returncode != 0 and "Permission denied" in peek.stderr
        listing = subprocess.run(
            ["setpriv", f"--reuid={other_uid}", f"--regid={other_uid}", "--clear-groups",
             "ls", str(parts.volume.path.parent)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert listing.returncode != 0, "the volumes' parents cannot be listed"
        # From inside another sandbox: the host path of the first one's volume is nowhere.
        path = parts.volume.workspace / "s"
        probe = await _on_volume(
            executor,
            _sh(f"cat {path} /oldroot{path} 2>&1; ls {executor.config.runtime_dir} 2>&1"),
        )
    assert "secret" not in probe.logs
    assert probe.logs.count("No such file or directory") == 3, probe.logs


async def test_symlinks_planted_in_the_volume_are_never_followed_by_the_host(
    executor: LocalExecutor, open_tmp: Path
) -> None:
    target = open_tmp / "host-file"
    target.write_text("host")
    target.chmod(0o666)
    script = (
        f"ln -s {target} /home/user/link && ln -s {target} /tmp/link && "
        f"ln -s {target} /usr/link && ln -s / /home/user/root && "
        "echo ready; exec sleep 60"
    )
    request = _sh(script)
    async with _running(executor, request):
        pass
    assert target.read_text() == "host" and target.exists()
    assert not _volumes_mounted(executor)


def test_volumes_of_a_dead_server_are_swept_at_start(open_tmp: Path) -> None:
    runtime = open_tmp / "run"
    stale = runtime / VOLUMES / f"i{_dead_pid()}" / "rf-old"
    stale.mkdir(parents=True)
    mount_tmpfs(str(stale), 1 << 20, 0o710, gid=0)
    (stale / "file").write_text("left behind")
    volumes = Volumes(runtime)
    try:
        assert not mounts_under(str(stale.parent)), "unmounted"
        assert not stale.parent.exists(), "and removed"
    finally:
        volumes.close()


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


async def test_a_server_with_a_strict_umask_still_gives_sandboxes_their_volume(
    host: Host,
) -> None:
    """systemd units often run with UMask=0077: the directories the sandbox's uid must
    traverse are made traversable whatever the umask."""
    previous = os.umask(0o077)
    try:
        executor = LocalExecutor(Config(checkpoint_bytes=1 << 20), host=host)
        try:
            result = await _on_volume(executor, _sh("echo hi > /usr/x && cat /usr/x"))
        finally:
            await executor.aclose()
    finally:
        os.umask(previous)
    assert (result.status, result.logs) == (Status.SUCCEEDED, "hi\n"), result


def test_closing_one_volumes_keeps_anothers_of_the_same_process_working(
    open_tmp: Path,
) -> None:
    runtime = open_tmp / "run"
    runtime.mkdir()
    first, second = Volumes(runtime), Volumes(runtime)
    first.close()  # removes this process's (empty) directory
    try:
        volume = second.create("rf-after", 1 << 20, (), root_uid=65000, user_uid=65000)
        assert volume.workspace.stat().st_uid == 65000
        volume.close()
    finally:
        second.close()
    assert not mounts_under(str(runtime))


def test_a_volume_bounds_its_inodes_not_only_its_bytes(open_tmp: Path) -> None:
    """Directories, symlinks and hard links take no blocks: without nr_inodes a volume of
    16 MiB would take inodes (kernel memory) up to half of RAM."""
    runtime = open_tmp / "run"
    runtime.mkdir()
    volumes = Volumes(runtime)
    try:
        volume = volumes.create("rf-inodes", 16 << 20, (), root_uid=65000, user_uid=65000)
        try:
            assert os.statvfs(volume.path).f_files == max(MIN_INODES, (16 << 20) // BYTES_PER_INODE)
            made = 0
            with pytest.raises(OSError) as full:
                for made in range(100_000):
                    os.mkdir(volume.workspace / f"d{made}")
            assert full.value.errno == errno.ENOSPC and made < MIN_INODES + 1, made
        finally:
            volume.close()
    finally:
        volumes.close()
