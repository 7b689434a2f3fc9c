"""Rollback of an overlay's upper layer while the overlay is mounted, case by case.

The overlay is mounted as a sandbox's is: by an unprivileged host uid in a user namespace of
its own (``userxattr``: ``user.overlay.*`` xattrs, whiteouts owned by that uid), with its
upper and work directories on a server-mounted tmpfs. The sandbox changes files through the
overlay and looks names up (which leaves positive and negative dentries in the overlay's
cache); the host restores through ``/proc/<pid>/root``, as the server does. After each
rollback the merged view, seen from the host and from inside, is the checkpoint's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from ringfence.backends.local.snapshots import Budget, OverlayView, SnapshotStore
from ringfence.errors import SandboxError
from tests.backends.snapshot_helpers import (
    KEY,
    OWNERS,
    U,
    chown_tree,
    make,
    state_of,
    stores_closed,  # noqa: F401 (autouse)
    tmpfs,
)

REPL = """
import os, shutil, sys
for line in sys.stdin:
    try:
        exec(line)
        print("ok", flush=True)
    except Exception as exc:
        print("error", repr(exc), flush=True)
"""


@dataclass
class Sandbox:
    """A process in its own user and mount namespaces with the overlay mounted at
    ``merged``; ``run`` executes one line of Python there (as its root: host uid U)."""

    proc: subprocess.Popen[str]
    merged: PurePosixPath
    upper: Path

    def run(self, line: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer == "ok", f"{line}: {answer}"

    @property
    def view(self) -> OverlayView:
        return OverlayView(Path(f"/proc/{self.proc.pid}/root"), self.merged)

    @property
    def seen(self) -> Path:
        """The merged directory as the host reaches it (through the sandbox's root)."""
        return Path(f"/proc/{self.proc.pid}/root{self.merged}")


@contextlib.contextmanager
def sandbox_with_overlay(base: Path, lower: Path, name: str = "sbx") -> Iterator[Sandbox]:
    upper, work, merged = base / "vol" / f"up-{name}", base / "vol" / f"wk-{name}", base / name
    for directory in (upper, work, merged):
        directory.mkdir()
        os.chown(directory, U, U)
    options = f"lowerdir={lower},upperdir={upper},workdir={work},userxattr"
    proc = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={U}",
            f"--regid={U}",
            "--clear-groups",
            "--",
            "unshare",
            "-Urm",
            "sh",
            "-c",
            f'mount -t overlay overlay -o {options} {merged} && exec /usr/bin/python3 -c "$0"',
            REPL,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    sandbox = Sandbox(proc, PurePosixPath(merged), upper)
    try:
        sandbox.run("pass")  # the overlay is mounted once the interpreter answers
        yield sandbox
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def base() -> Iterator[Path]:
    # Not under pytest's tmp_path: its parents are root's alone, and the sandbox's uid
    # must reach the lower directory and the mount point.
    root = Path(f"/tmp/rf-snap-overlay-{os.getpid()}")
    root.mkdir(mode=0o755)
    try:
        with tmpfs(root / "vol"):
            (root / "vol" / "snapshots").mkdir(mode=0o700)
            yield root
    finally:
        shutil.rmtree(root)


@pytest.fixture
def lower(base: Path) -> Path:
    """The template's files (owned by an id the sandbox maps, or copy-up would fail)."""
    lower = base / "lower"
    make(lower / "a", b"lower a\n")
    make(lower / "keep", b"never touched\n")
    make(lower / "d" / "x", b"lower d/x\n")
    make(lower / "d" / "y", b"lower d/y\n")
    make(lower / "e" / "z", b"lower e/z\n")
    chown_tree(lower)
    return lower


# "M" below: the merged directory, inside the sandbox.
# name: (what the sandbox does before the checkpoint, what it does after it)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "a file made after the checkpoint": (
        [],
        ["open(M + '/new', 'w').write('new')", "open(M + '/new').read()"],
    ),
    "an upper file deleted": (
        ["open(M + '/up', 'w').write('upper only')"],
        ["os.unlink(M + '/up')", "assert not os.path.exists(M + '/up')"],
    ),
    "a lower file deleted": ([], ["os.unlink(M + '/a')", "assert not os.path.exists(M + '/a')"]),
    "a lower file changed": ([], ["open(M + '/a', 'w').write('changed')", "open(M + '/a').read()"]),
    "a lower file chmodded": ([], ["os.chmod(M + '/a', 0o600)", "os.stat(M + '/a')"]),
    "an upper file changed": (
        ["open(M + '/up', 'w').write('first')"],
        ["open(M + '/up', 'w').write('second, longer')", "open(M + '/up').read()"],
    ),
    "an upper file replaced by rename": (
        ["open(M + '/up', 'w').write('first')"],
        [
            "open(M + '/t', 'w').write('other')",
            "os.rename(M + '/t', M + '/up')",
            "open(M + '/up').read()",
        ],
    ),
    "a lower file renamed": (
        [],
        ["os.rename(M + '/a', M + '/a2')", "assert not os.path.exists(M + '/a')"],
    ),
    "a lower directory replaced": (
        [],
        [
            "shutil.rmtree(M + '/d')",
            "os.mkdir(M + '/d')",
            "open(M + '/d/new', 'w').write('n')",
            "os.listdir(M + '/d')",
            "assert not os.path.exists(M + '/d/x')",
        ],
    ),
    "a file added to a lower directory": (
        [],
        ["open(M + '/d/new', 'w').write('n')", "os.listdir(M + '/d')"],
    ),
    "a file of a lower directory deleted": (
        [],
        ["os.unlink(M + '/d/x')", "assert not os.path.exists(M + '/d/x')"],
    ),
    "a whiteout of the checkpoint made a file again": (
        ["os.unlink(M + '/a')"],
        ["open(M + '/a', 'w').write('again')", "os.stat(M + '/a')"],
    ),
    "an opaque directory of the checkpoint merged again": (
        ["shutil.rmtree(M + '/e')", "os.mkdir(M + '/e')", "open(M + '/e/mine', 'w').write('m')"],
        ["shutil.rmtree(M + '/e')", "assert not os.path.exists(M + '/e')"],
    ),
    "a symlink retargeted": (
        ["os.symlink('a', M + '/s')"],
        ["os.unlink(M + '/s')", "os.symlink('d', M + '/s')", "os.listdir(M + '/s')"],
    ),
    "a file replaced by a directory": (
        ["open(M + '/f', 'w').write('file')"],
        ["os.unlink(M + '/f')", "os.mkdir(M + '/f')", "os.listdir(M + '/f')"],
    ),
    "a hard link broken and its name reused": (
        ["open(M + '/up', 'w').write('linked')", "os.link(M + '/up', M + '/up2')"],
        ["os.unlink(M + '/up2')", "open(M + '/up2', 'w').write('other')", "os.stat(M + '/up2')"],
    ),
    "a directory replaced by a file": (
        ["os.mkdir(M + '/g')", "open(M + '/g/h', 'w').write('h')"],
        ["shutil.rmtree(M + '/g')", "open(M + '/g', 'w').write('g')", "os.stat(M + '/g')"],
    ),
}


def _visible(sandbox: Sandbox) -> dict[str, tuple[object, ...]]:
    return state_of({"merged": sandbox.seen})


@pytest.mark.parametrize("case", list(CASES))
def test_rollback_through_a_mounted_overlay(base: Path, lower: Path, case: str) -> None:
    before, after = CASES[case]
    with sandbox_with_overlay(base, lower) as sandbox:
        for line in before:
            sandbox.run(line.replace("M +", repr(str(sandbox.merged)) + " +"))
        store = SnapshotStore(
            base / "vol" / "snapshots", {"usr": sandbox.upper}, OWNERS, Budget(8, 1 << 30), KEY
        )
        checkpoint = store.take()
        visible = _visible(sandbox)
        for line in after:
            sandbox.run(line.replace("M +", repr(str(sandbox.merged)) + " +"))
        assert _visible(sandbox) != visible
        store.restore(checkpoint.id, overlay_view={"usr": sandbox.view})
        assert _visible(sandbox) == visible
        # And inside: every entry the checkpoint shows reads the same, no other one is there.
        for path, entry in visible.items():
            inside = repr(str(sandbox.merged / path.removeprefix("merged").lstrip("/")))
            sandbox.run(f"st = os.lstat({inside}); assert st.st_mode == {entry[0]}")
        names = sorted(p.removeprefix("merged/") for p in visible if p.count("/") == 1)
        sandbox.run(f"assert sorted(os.listdir({str(sandbox.merged)!r})) == {names}")


def test_lower_contents_come_back_without_leaving_a_copy_in_the_upper(
    base: Path, lower: Path
) -> None:
    with sandbox_with_overlay(base, lower) as sandbox:
        store = SnapshotStore(
            base / "vol" / "snapshots", {"usr": sandbox.upper}, OWNERS, Budget(8, 1 << 30), KEY
        )
        checkpoint = store.take()
        m = repr(str(sandbox.merged))
        sandbox.run(f"open({m} + '/a', 'w').write('changed'); os.unlink({m} + '/keep')")
        store.restore(checkpoint.id, overlay_view={"usr": sandbox.view})
        assert os.listdir(sandbox.upper) == []
        sandbox.run(f"assert open({m} + '/a').read() == 'lower a\\n'")
        sandbox.run(f"assert open({m} + '/keep').read() == 'never touched\\n'")


def test_a_view_that_is_not_the_layers_overlay_is_refused(base: Path, lower: Path) -> None:
    with (
        sandbox_with_overlay(base, lower, "one") as one,
        sandbox_with_overlay(base, lower, "two") as two,
    ):
        store = SnapshotStore(
            base / "vol" / "snapshots", {"usr": one.upper}, OWNERS, Budget(8, 1 << 30), KEY
        )
        checkpoint = store.take()
        for wrong in (
            two.view,  # another sandbox's overlay
            OverlayView(Path("/"), PurePosixPath(str(one.upper))),  # not an overlay at all
        ):
            with pytest.raises(SandboxError):
                store.restore(checkpoint.id, overlay_view={"usr": wrong})
        assert os.listdir(two.upper) == [] and os.listdir(one.upper) == []


def test_a_symlink_in_the_path_of_the_view_is_not_followed(base: Path, lower: Path) -> None:
    with sandbox_with_overlay(base, lower) as sandbox:
        sandbox.run(f"os.symlink({str(sandbox.merged)!r}, {str(sandbox.merged)!r} + '/inner')")
        store = SnapshotStore(
            base / "vol" / "snapshots", {"usr": sandbox.upper}, OWNERS, Budget(8, 1 << 30), KEY
        )
        checkpoint = store.take()
        via_link = OverlayView(sandbox.view.proc_root, sandbox.merged / "inner")
        with pytest.raises(SandboxError):
            store.restore(checkpoint.id, overlay_view={"usr": via_link})
        store.restore(checkpoint.id, overlay_view={"usr": sandbox.view})


def test_a_refused_view_changes_no_layer(base: Path, lower: Path) -> None:
    """Review I1: the plain layers were restored before the view was checked."""
    from ringfence.backends.local.snapshots import RestoreIncomplete

    with (
        sandbox_with_overlay(base, lower, "one") as one,
        sandbox_with_overlay(base, lower, "two") as two,
    ):
        plain = base / "vol" / "ws"
        plain.mkdir()
        make(plain / "f", b"at the checkpoint")
        chown_tree(plain)
        os.chown(plain, U, U)
        layers = {"ws": plain, "usr": one.upper}
        store = SnapshotStore(base / "vol" / "snapshots", layers, OWNERS, Budget(8, 1 << 30), KEY)
        checkpoint = store.take()
        (plain / "f").write_bytes(b"after it")
        one.run(f"open({str(one.merged)!r} + '/new', 'w').write('n')")
        with pytest.raises(SandboxError) as exc:
            store.restore(checkpoint.id, overlay_view={"usr": two.view})
        assert not isinstance(exc.value, RestoreIncomplete)
        assert (plain / "f").read_bytes() == b"after it"
        assert os.listdir(one.upper) == ["new"]


def test_a_rollback_through_a_view_never_touches_a_mount_in_it(base: Path, lower: Path) -> None:
    """Review I3 (repro e.py): removing a copied-up directory through the view descended
    into a host directory bound below it and unlinked there as host root."""
    from ringfence.backends.local.snapshots import RestoreIncomplete

    host = base / "host"
    make(host / "precious", b"the host's", mode=0o600)  # root's: the sandbox cannot remove it
    with sandbox_with_overlay(base, lower) as sandbox:
        store = SnapshotStore(
            base / "vol" / "snapshots", {"usr": sandbox.upper}, OWNERS, Budget(8, 1 << 30), KEY
        )
        checkpoint = store.take()
        m = repr(str(sandbox.merged))
        sandbox.run(f"open({m} + '/d/new', 'w').write('copies d up')")
        sandbox.run(
            f"import subprocess; subprocess.run(['mount', '--bind', {str(host)!r}, {m} + '/d'],"
            " check=True)"
        )
        with pytest.raises(SandboxError, match="mounted") as exc:
            store.restore(checkpoint.id, overlay_view={"usr": sandbox.view})
        assert not isinstance(exc.value, RestoreIncomplete)  # refused before any write
        assert (host / "precious").read_bytes() == b"the host's"
        assert sorted(os.listdir(sandbox.upper / "d")) == ["new"]
