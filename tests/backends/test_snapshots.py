"""The snapshot engine on real tmpfs volumes (and real overlays: tests/backends/
test_snapshots_overlay.py): checkpoints are byte-identical and incremental, hostile trees
(symlinks to host files and to another volume, swaps between checkpoints, fifos, devices,
foreign owners, deep nesting, long names) are never followed nor copied as root, budgets
hold, a checkpoint taken while a writer loops in a frozen cgroup is consistent."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringfence.backends.local.cgroups import _V2Cgroup, parse_mountinfo, parse_proc_cgroup
from ringfence.backends.local.snapshots import Budget, SnapshotStore
from ringfence.backends.local.snapshots._fs import remove_tree
from ringfence.errors import CheckpointNotFound, SandboxError, SnapshotBudgetExceeded
from tests.backends.snapshot_helpers import (  # noqa: F401 (stores_closed: autouse)
    KEY,
    OWNERS,
    U,
    Volume,
    chown_tree,
    make,
    state_of,
    stores_closed,
    tmpfs,
)

BIG = Budget(count=64, bytes=1 << 30)


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Volume]:
    with tmpfs(tmp_path / "vol") as root:
        yield Volume.create(root, ("workspace", "tmp"))


def _store(volume: Volume, budget: Budget = BIG) -> SnapshotStore:
    return SnapshotStore(volume.snapshots, volume.layers, OWNERS, budget, KEY)


def _sample_tree(volume: Volume) -> None:
    ws, tmp = volume.layers["workspace"], volume.layers["tmp"]
    make(ws / "a.txt", b"alpha\n")
    make(ws / "empty", b"")
    make(ws / "run.sh", b"#!/bin/sh\necho hi\n", mode=0o4755)  # setuid, the sandbox's own
    make(ws / "src" / "pkg" / "mod.py", b"x = 1\n" * 1000)
    make(ws / "src" / "big.bin", os.urandom(3 << 20))
    make(ws / ("n" * 255), b"a long name")
    os.symlink("src/pkg/mod.py", ws / "link")
    os.symlink("/etc/shadow", ws / "shadow")  # a host file: copied as a link, never read
    os.setxattr(ws / "a.txt", "user.note", b"kept")
    deep = ws / "deep"
    for i in range(100):
        deep = deep / f"d{i}"
    make(deep / "bottom", b"bottom")
    make(tmp / "scratch", b"tmp file", mode=0o600)
    (ws / "private").mkdir(mode=0o700)
    chown_tree(volume.root)


def test_rollback_restores_every_byte_and_every_attribute(volume: Volume) -> None:
    _sample_tree(volume)
    store = _store(volume)
    before = state_of(volume.layers)
    checkpoint = store.take()
    assert checkpoint.id.startswith("ck") and checkpoint.files > 100

    ws = volume.layers["workspace"]
    (ws / "a.txt").write_bytes(b"changed, longer than before\n")
    (ws / "empty").write_bytes(b"no longer empty")
    os.chmod(ws / "run.sh", 0o644)
    os.removexattr(ws / "a.txt", "user.note")
    os.unlink(ws / "src" / "big.bin")
    make(ws / "made-later" / "x", b"new")
    os.unlink(ws / "link")
    os.symlink("elsewhere", ws / "link")
    os.rename(ws / "src" / "pkg", ws / "pkg-moved")
    (ws / "src" / "pkg").write_bytes(b"a file where a directory was")
    os.utime(ws / "private", ns=(1, 2))
    os.unlink(volume.layers["tmp"] / "scratch")
    chown_tree(volume.root)
    assert state_of(volume.layers) != before

    store.restore(checkpoint.id)
    assert state_of(volume.layers) == before
    # Twice in a row, after more changes: the checkpoint itself was not changed by either.
    (ws / "a.txt").write_bytes(b"again")
    store.restore(checkpoint.id)
    assert state_of(volume.layers) == before


def test_unchanged_files_are_shared_with_the_previous_checkpoint(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    for i in range(20):
        make(ws / f"f{i}", os.urandom(4096))
    chown_tree(volume.root)
    time.sleep(0.02)  # past the clock tick the files were written in (racy ones are copied)
    store = _store(volume)
    first = store.take()
    assert first.bytes == 20 * 4096
    (ws / "f3").write_bytes(b"changed")
    second = store.take()
    assert second.bytes == len(b"changed"), "only the changed file is copied"
    with store.opened(first.id) as a, store.opened(second.id) as b:
        same = os.stat("workspace/f0", dir_fd=a).st_ino == os.stat("workspace/f0", dir_fd=b).st_ino
        differ = (
            os.stat("workspace/f3", dir_fd=a).st_ino != os.stat("workspace/f3", dir_fd=b).st_ino
        )
    assert same and differ
    assert store.used_bytes == 20 * 4096 + len(b"changed")
    store.delete(first.id)
    assert store.used_bytes == 19 * 4096 + len(b"changed"), "what the later one shares stays"
    # The live file is never one of the snapshot's inodes: changing it changes no snapshot.
    assert os.stat(ws / "f0").st_nlink == 1


def test_a_change_in_the_clock_tick_of_the_checkpoint_is_not_missed(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    store = _store(volume)
    make(ws / "f", b"1111")
    chown_tree(volume.root)
    for _ in range(50):  # same size, same inode, written right after each checkpoint
        store.take()
        (ws / "f").write_bytes(b"2222")
        latest = store.take()
        with store.opened(latest.id) as fd:
            assert Path(f"/proc/self/fd/{fd}/workspace/f").read_bytes() == b"2222"
        (ws / "f").write_bytes(b"1111")
        for checkpoint in store.list():
            store.delete(checkpoint.id)


def test_symlinks_planted_by_the_sandbox_are_never_followed(volume: Volume, tmp_path: Path) -> None:
    host_file = tmp_path / "host-secret"
    host_file.write_bytes(b"host secret")
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    with tmpfs(tmp_path / "other") as other_root:
        other = Volume.create(other_root, ("workspace",))
        make(other.layers["workspace"] / "their-file", b"another sandbox's file")
        ws = volume.layers["workspace"]
        os.symlink(host_file, ws / "to-host")
        os.symlink(other.layers["workspace"] / "their-file", ws / "to-other-volume")
        os.symlink(host_dir, ws / "to-host-dir")
        make(ws / "d" / "inside", b"inside d")
        make(ws / "f", b"a regular file")
        chown_tree(volume.root)
        store = _store(volume)
        checkpoint = store.take()
        with store.opened(checkpoint.id) as fd:
            snap = Path(f"/proc/self/fd/{fd}/workspace")
            assert os.readlink(snap / "to-host") == str(host_file)
            assert os.readlink(snap / "to-other-volume").endswith("their-file")
        before = state_of(volume.layers)

        # Between checkpoint and rollback: the directory and the file become links to the
        # host; a rollback writing "d/inside" or "f" through them would change host files.
        os.rename(ws / "d", ws / "d-old")
        os.symlink(host_dir, ws / "d")
        os.unlink(ws / "f")
        os.symlink(host_file, ws / "f")
        chown_tree(volume.root)
        swapped = store.take()  # and a checkpoint of the swapped tree copies links only
        with store.opened(swapped.id) as fd:
            assert os.path.islink(f"/proc/self/fd/{fd}/workspace/d")
        store.restore(checkpoint.id)
        assert state_of(volume.layers) == before
        assert host_file.read_bytes() == b"host secret" and list(host_dir.iterdir()) == []
        assert (other.layers["workspace"] / "their-file").read_bytes() == b"another sandbox's file"


def test_fifos_and_sockets_are_skipped_and_left_alone(volume: Volume) -> None:
    tmp = volume.layers["tmp"]
    make(tmp / "file", b"kept")
    os.mkfifo(tmp / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp / "sock"))
    chown_tree(volume.root)
    try:
        store = _store(volume)
        checkpoint = store.take()  # a reader-less fifo would block an open: it is never opened
        assert sorted(store.skipped(checkpoint.id)) == ["tmp/fifo", "tmp/sock"]
        with store.opened(checkpoint.id) as fd:
            assert sorted(os.listdir(f"/proc/self/fd/{fd}/tmp")) == ["file"]
        store.restore(checkpoint.id)
        assert stat.S_ISFIFO(os.lstat(tmp / "fifo").st_mode)
        assert stat.S_ISSOCK(os.lstat(tmp / "sock").st_mode)
    finally:
        server.close()


def test_a_device_node_is_refused_and_nothing_is_captured(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    make(ws / "ok", b"fine")
    os.mknod(ws / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    chown_tree(volume.root)
    store = _store(volume)
    with pytest.raises(SandboxError) as exc:
        store.take()
    assert exc.value.code == "sandbox_error" and "null" in str(exc.value)
    assert store.list() == [] and os.listdir(volume.snapshots) == []


@pytest.mark.parametrize("owner", [(0, 0), (U, 0), (4242, 4242)])
def test_a_file_of_a_foreign_owner_is_refused(volume: Volume, owner: tuple[int, int]) -> None:
    ws = volume.layers["workspace"]
    make(ws / "mine", b"mine")
    chown_tree(volume.root)
    make(ws / "theirs", b"not the sandbox's", mode=0o4755)
    os.chown(ws / "theirs", *owner)
    store = _store(volume)
    with pytest.raises(SandboxError) as exc:
        store.take()
    assert "theirs" in str(exc.value)
    assert os.listdir(volume.snapshots) == []


def test_no_copy_belongs_to_root_and_setuid_stays_the_sandboxs(volume: Volume) -> None:
    _sample_tree(volume)
    store = _store(volume)
    checkpoint = store.take()
    snapshot = volume.snapshots / checkpoint.id
    assert os.stat(volume.snapshots).st_uid == 0
    assert stat.S_IMODE(os.stat(volume.snapshots).st_mode) == 0o700
    owners_seen = set()
    for directory, dirs, files in os.walk(snapshot):
        for name in dirs + files:
            st = os.lstat(os.path.join(directory, name))
            owners_seen.add((st.st_uid, st.st_gid))
    assert owners_seen == {(U, U)}
    assert os.stat(snapshot / "workspace" / "run.sh").st_mode & stat.S_ISUID


def test_owners_may_not_include_host_root(volume: Volume) -> None:
    with pytest.raises(ValueError):
        SnapshotStore(volume.snapshots, volume.layers, (0, U), BIG, KEY)


def test_the_snapshot_root_must_be_roots_alone(volume: Volume) -> None:
    os.chmod(volume.snapshots, 0o755)
    with pytest.raises(SandboxError):
        _store(volume)


def test_budgets_count_and_bytes(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    make(ws / "f", b"x" * 1000)
    chown_tree(volume.root)
    store = _store(volume, Budget(count=2, bytes=2500))
    first = store.take()
    (ws / "f").write_bytes(b"y" * 1000)
    store.take()
    with pytest.raises(SnapshotBudgetExceeded) as exc:
        store.take()
    assert exc.value.code == "snapshot_budget_exceeded"
    store.delete(first.id)
    (ws / "f").write_bytes(b"z" * 1000)
    (ws / "g").write_bytes(b"w" * 1000)
    chown_tree(volume.root)
    with pytest.raises(SnapshotBudgetExceeded):
        store.take()  # 2000 more bytes on top of 1000: past 2500
    assert len(store.list()) == 1 and len(os.listdir(volume.snapshots)) == 1
    with pytest.raises(CheckpointNotFound):
        store.delete(first.id)
    with pytest.raises(CheckpointNotFound):
        store.restore("ck0000")


def test_entries_are_budgeted_though_they_hold_no_bytes(volume: Volume) -> None:
    """Review C1: empty directories, links and empty files cost the server's kernel memory
    (an inode, a dentry) in every checkpoint; a byte budget never sees them."""
    ws = volume.layers["workspace"]
    for d in range(200):
        make(ws / f"d{d}" / "empty", b"")
        os.symlink("empty", ws / f"d{d}" / "link")
    chown_tree(volume.root)
    store = _store(volume, Budget(count=64, bytes=1 << 30, entries=1500))
    first = store.take()  # 2 layer roots + 600 entries
    assert store.used_bytes == 0 and store.used_entries == 602
    store.take()  # unchanged files are shared, but each checkpoint's names are its own
    assert store.used_entries == 1204
    with pytest.raises(SnapshotBudgetExceeded, match="entries"):
        store.take()
    assert len(store.list()) == 2 and len(os.listdir(volume.snapshots)) == 2
    store.delete(first.id)
    assert store.used_entries == 602
    store.take()


def test_the_default_budget_counts_entries() -> None:
    assert Budget(count=1, bytes=1).entries > 0


def test_twenty_thousand_files(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    for d in range(100):
        (ws / f"d{d}").mkdir()
        for f in range(200):
            (ws / f"d{d}" / f"f{f}").write_bytes(b"%d/%d" % (d, f))
    chown_tree(volume.root)
    store = _store(volume)
    before = state_of(volume.layers)
    checkpoint = store.take()
    assert checkpoint.files == 100 + 20_000
    (ws / "d7" / "f7").write_bytes(b"changed")
    os.unlink(ws / "d8" / "f8")
    store.take()
    store.restore(checkpoint.id)
    assert state_of(volume.layers) == before


# -- a checkpoint while a writer loops -----------------------------------------------------

WRITER = """
import os, sys
os.chdir(sys.argv[1])  # then the sandbox's uid: the path above it is root's alone
uid = int(sys.argv[2])
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
n = 0
while True:  # invariant between two steps: count == number of files, or one file more
    n += 1
    with open(f"f{n}", "w") as f:
        f.write(str(n))
    with open("count.tmp", "w") as f:
        f.write(str(n))
    try:
        os.rename("count.tmp", "count")
    except FileNotFoundError:
        pass  # a rollback took count.tmp away between the two steps: files do vanish
"""


@pytest.fixture
def unified_cgroup() -> Iterator[_V2Cgroup]:
    mount = next(
        m
        for m in parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        if m.fstype == "cgroup2"
    )
    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text()).get("", "/")
    directory = Path(mount.mountpoint + own) / f"ringfence-snap-test-{os.getpid()}"
    directory.mkdir()
    cgroup = _V2Cgroup(directory)
    yield cgroup
    cgroup.remove()


def test_a_checkpoint_while_a_writer_loops_is_consistent(
    volume: Volume, unified_cgroup: _V2Cgroup
) -> None:
    ws = volume.layers["workspace"]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(ws), str(U)])
    try:
        assert unified_cgroup.add(writer.pid)
        store = _store(volume)
        views = []
        for _ in range(5):
            deadline = time.monotonic() + 10
            while not (ws / "count").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            with unified_cgroup.frozen():
                checkpoint = store.take()
                views.append((checkpoint.id, state_of(volume.layers)))
            with store.opened(checkpoint.id) as fd:
                snap = Path(f"/proc/self/fd/{fd}/workspace")
                count = int((snap / "count").read_text())
                made = {p.name for p in snap.iterdir() if p.name.startswith("f")}
            assert made in (
                {f"f{i}" for i in range(1, count + 1)},
                {f"f{i}" for i in range(1, count + 2)},
            )
        for checkpoint_id, frozen_view in (views[0], views[-1], views[2]):
            with unified_cgroup.frozen():
                store.restore(checkpoint_id)
                assert state_of(volume.layers) == frozen_view
            files = len(os.listdir(ws))
            deadline = time.monotonic() + 10
            while len(os.listdir(ws)) == files and time.monotonic() < deadline:
                time.sleep(0.005)
            assert writer.poll() is None and len(os.listdir(ws)) != files, "it runs on"
    finally:
        writer.kill()
        writer.wait()


def test_a_full_volume_is_the_budget_exceeded_and_leaves_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", size="8m") as root:
        volume = Volume.create(root, ("workspace",))
        make(volume.layers["workspace"] / "big", os.urandom(5 << 20))
        chown_tree(volume.root)
        store = _store(volume)  # the byte budget is larger than what the volume has left
        with pytest.raises(SnapshotBudgetExceeded):
            store.take()
        assert store.list() == [] and os.listdir(volume.snapshots) == []
        assert store.used_bytes == 0


def test_hard_links_come_back_as_one_file(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    make(ws / "a", b"shared")
    (ws / "sub").mkdir()
    os.link(ws / "a", ws / "sub" / "b")
    os.link(ws / "a", ws / "c")
    make(ws / "lone", b"alone")
    chown_tree(volume.root)
    store = _store(volume)
    before = state_of(volume.layers)
    checkpoint = store.take()
    with store.opened(checkpoint.id) as fd:
        inodes = {os.stat(p, dir_fd=fd).st_ino for p in ("workspace/a", "workspace/sub/b")}
        assert len(inodes) == 1
    # The sandbox breaks the group three ways, and links a file that was alone.
    os.unlink(ws / "sub" / "b")
    make(ws / "sub" / "b", b"a copy now")
    os.unlink(ws / "a")
    os.link(ws / "lone", ws / "lone-too")
    chown_tree(volume.root)
    store.take()  # a checkpoint in between: the next restore starts from other books
    store.restore(checkpoint.id)
    assert state_of(volume.layers) == before
    assert os.stat(ws / "a").st_ino == os.stat(ws / "sub" / "b").st_ino == os.stat(ws / "c").st_ino
    # Unchanged since: still one inode, nothing rewritten (the group is left as it is).
    store.restore(checkpoint.id)
    assert state_of(volume.layers) == before


def _nest(root: Path, levels: int) -> None:
    """``levels`` directories inside each other (deeper than any path the kernel takes)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            os.chown("d", U, U, dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.fchown(leaf, U, U)
        os.close(leaf)
    finally:
        os.close(fd)


def test_nesting_past_the_limit_is_refused_and_any_depth_rolls_back(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    (ws / "deep").mkdir()
    os.chown(ws / "deep", U, U)
    _nest(ws / "deep", 600)
    store = _store(volume)
    with pytest.raises(SandboxError) as exc:
        store.take()
    assert "deeper" in str(exc.value) and os.listdir(volume.snapshots) == []
    layer = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        remove_tree(layer, "deep")  # 600 levels: the removal is not recursive either
    finally:
        os.close(layer)
    assert not (ws / "deep").exists()
    before = state_of(volume.layers)
    checkpoint = store.take()
    (ws / "deeper").mkdir()
    os.chown(ws / "deeper", U, U)
    _nest(ws / "deeper", 5000)  # made after the checkpoint: the rollback removes it all
    store.restore(checkpoint.id)
    assert state_of(volume.layers) == before


def test_a_layer_that_is_a_symlink_is_refused(volume: Volume, tmp_path: Path) -> None:
    ws = volume.layers["workspace"]
    ws.rmdir()
    ws.symlink_to(tmp_path)  # a layer swapped for a link to a host directory
    with pytest.raises(SandboxError):
        _store(volume).take()
    assert os.listdir(volume.snapshots) == []


def test_file_capabilities_and_acls_are_not_kept(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    make(ws / "tool", b"\x7fELF")
    chown_tree(volume.root)
    subprocess.run(["setcap", "cap_net_raw+ep", str(ws / "tool")], check=True)
    os.setxattr(ws / "tool", "user.kept", b"yes")
    store = _store(volume)
    checkpoint = store.take()
    with store.opened(checkpoint.id) as fd:
        kept = os.listxattr(f"/proc/self/fd/{fd}/workspace/tool")
    assert kept == ["user.kept"]  # no security.capability: it gives nothing on the host


# -- review 16a: restores that cannot finish, mappings, devices, mounts --------------------


def _owned_by_root(layers: dict[str, Path]) -> list[str]:
    return [
        path
        for path, entry in state_of(layers).items()
        if entry[1] == 0 or entry[2] == 0  # uid, gid
    ]


def test_a_rollback_the_volume_has_no_room_for_is_refused_before_it_writes(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "small", size="12m") as root:
        volume = Volume.create(root, ("workspace",))
        ws = volume.layers["workspace"]
        make(ws / "big", os.urandom(5 << 20))
        chown_tree(volume.root)
        store = _store(volume)
        first = store.take()  # 10 MiB used: the file and its copy
        os.unlink(ws / "big")
        make(ws / "filler", os.urandom(3400 << 10))
        chown_tree(volume.root)
        store.take()  # ~11.8 MiB: a rollback to first would need 5 MiB, frees 3.4
        before = state_of(volume.layers)
        with pytest.raises(SnapshotBudgetExceeded, match="nothing was changed"):
            store.restore(first.id)
        assert state_of(volume.layers) == before


def test_a_rollback_that_fails_part_way_is_incomplete_and_leaves_no_root_file(
    volume: Volume, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review I1: a volume full mid-rollback left a uid-0 directory and file behind (made
    as root, chowned at the end), and the error read like any refusal."""
    from ringfence.backends.local.snapshots import RestoreIncomplete, _fs

    ws = volume.layers["workspace"]
    make(ws / "dir" / "big", b"x" * 10_000)
    make(ws / "dir" / "sub" / "f", b"f")
    chown_tree(volume.root)
    store = _store(volume)
    checkpoint = store.take()
    remove_tree(os.open(ws, os.O_RDONLY | os.O_DIRECTORY), "dir")

    def full(src: int, dst: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_fs, "copy_data", full)
    with pytest.raises(RestoreIncomplete) as exc:
        store.restore(checkpoint.id)
    assert isinstance(exc.value, SandboxError) and "must not run on" in str(exc.value)
    assert (ws / "dir").exists() and _owned_by_root(volume.layers) == []


def test_a_device_node_found_by_a_rollback_is_removed(volume: Volume) -> None:
    ws = volume.layers["workspace"]
    make(ws / "a", b"a")
    chown_tree(volume.root)
    store = _store(volume)
    checkpoint = store.take()
    os.mknod(ws / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    store.restore(checkpoint.id)
    assert sorted(os.listdir(ws)) == ["a"]


def test_a_view_walk_never_crosses_a_mount(volume: Volume, tmp_path: Path) -> None:
    """Review I3: the removal through a view descended into a bind mount (as host root)."""
    from ringfence.backends.local.snapshots._fs import mount_of

    ws = volume.layers["workspace"]
    (ws / "app" / "data").mkdir(parents=True)
    host = tmp_path / "host"
    make(host / "precious", b"the host's", mode=0o600)
    subprocess.run(["mount", "--bind", str(host), str(ws / "app" / "data")], check=True)
    try:
        fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(SandboxError, match="mounted"):
                remove_tree(fd, "app", mount_of(fd))
        finally:
            os.close(fd)
        assert (host / "precious").read_bytes() == b"the host's"
    finally:
        subprocess.run(["umount", str(ws / "app" / "data")], check=True)


def _snapshot_bytes(store: SnapshotStore, checkpoint_id: str, path: str) -> bytes:
    with store.opened(checkpoint_id) as snap:
        fd = os.open(path, os.O_RDONLY, dir_fd=snap)
        try:
            return os.pread(fd, 1 << 20, 0)
        finally:
            os.close(fd)


MAPPER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)  # then the sandbox's uid (the path is root's alone)
uid = int(sys.argv[2])
os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
print("mapped", flush=True)
for line in sys.stdin:
    m[0:4] = line.strip().encode()
    print("written", flush=True)
"""


def test_writes_through_a_shared_mapping_are_seen(volume: Volume) -> None:
    """Review I2: after its first write fault, a MAP_SHARED page of tmpfs stays writable:
    later writes move no ctime, and the incremental test called the file unchanged."""
    ws = volume.layers["workspace"]
    make(ws / "db", b"\0" * 4096)
    chown_tree(volume.root)
    proc = subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(ws / "db"), str(U)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def write(data: str) -> None:
        proc.stdin.write(data + "\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        assert proc.stdout.readline().strip() == "written"  # type: ignore[union-attr]

    try:
        assert proc.stdout.readline().strip() == "mapped"
        write("BBBB")
        ctime = os.stat(ws / "db").st_ctime_ns
        deadline = time.monotonic() + 5
        while time.clock_gettime_ns(5) <= ctime + 20_000_000:  # past the coarse tick
            assert time.monotonic() < deadline
            time.sleep(0.005)
        blind = _store(volume)  # without the processes: the attack as the review found it
        seeing = SnapshotStore(
            volume.snapshots, volume.layers, OWNERS, BIG, KEY, pids=lambda: [proc.pid]
        )
        blind.take()
        first = seeing.take()
        write("CCCC")
        assert os.stat(ws / "db").st_ctime_ns == ctime  # the write moved no ctime
        second = seeing.take()
        assert _snapshot_bytes(seeing, second.id, "workspace/db")[:4] == b"CCCC"
        missed = blind.take()  # the store was not told of the mapping: a stale copy
        assert _snapshot_bytes(blind, missed.id, "workspace/db")[:4] == b"BBBB"
        write("DDDD")
        seeing.restore(first.id)
        assert (ws / "db").read_bytes()[:4] == b"BBBB"
    finally:
        proc.kill()
        proc.wait()


def test_metadata_alone_changed_deep_in_a_tree_is_rolled_back(volume: Volume) -> None:
    """The apply walks only the directories the plan found changes in: a change of a
    directory's or a symlink's metadata alone (no file changed) is such a change."""
    ws = volume.layers["workspace"]
    make(ws / "a" / "b" / "c" / "f", b"f")
    os.symlink("f", ws / "a" / "b" / "c" / "s")
    make(ws / "other" / "g", b"g")
    chown_tree(volume.root)
    store = _store(volume)
    before = state_of(volume.layers)
    checkpoint = store.take()
    os.chmod(ws / "a" / "b", 0o700)
    os.setxattr(ws / "a" / "b" / "c", "user.x", b"1")
    os.chown(ws / "a" / "b" / "c" / "s", U + 1, U + 1, follow_symlinks=False)
    os.utime(ws / "other", ns=(1, 1))
    assert state_of(volume.layers) != before
    store.restore(checkpoint.id)
    assert state_of(volume.layers) == before


def test_an_error_inside_a_view_is_not_called_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review I1: ``_open_view`` wrapped its ``yield``: a failure part way through a layer
    read as "cannot reach the view" (a refusal), hiding that files had changed."""
    from pathlib import PurePosixPath

    from ringfence.backends.local.snapshots import OverlayView, _store

    (tmp_path / "merged").mkdir()
    monkeypatch.setattr(_store, "_fs_magic", lambda fd: _store._OVERLAYFS_MAGIC)
    view = OverlayView(Path("/"), PurePosixPath(str(tmp_path / "merged")))
    with pytest.raises(OSError, match="mid-layer") as exc, _store._open_view(view):
        raise OSError(28, "mid-layer")
    assert not isinstance(exc.value, SandboxError)
    with (
        pytest.raises(SandboxError, match="cannot reach"),
        _store._open_view(OverlayView(Path("/"), PurePosixPath(str(tmp_path / "absent")))),
    ):
        pass
