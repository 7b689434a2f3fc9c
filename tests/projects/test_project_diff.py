"""What a sandbox changed in its project view (``ringfence.projects.diff``), read from a
real overlay's upper layer: exact added, modified and deleted entries, unified diffs of
text, nothing shown that the directory's owner could not read, and the host untouched."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringfence import projects
from ringfence.projects import ProjectError, _changes, _diff
from tests.projects.conftest import View


def _tree(root: Path) -> dict[str, str]:
    """Every entry below ``root`` with its kind, mode, owner and content digest."""
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        what = ""
        if path.is_symlink():
            what = os.readlink(path)
        elif path.is_file():
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        found[str(path.relative_to(root))] = f"{oct(st.st_mode)} {st.st_uid}:{st.st_gid} {what}"
    return found


def _project(view: View) -> None:
    (view.host / "src").mkdir()
    (view.host / "src/app.py").write_text("def main():\n    return 1\n")
    (view.host / "README").write_text("hello\n")
    (view.host / "old.txt").write_text("old\n")
    (view.host / "same.txt").write_text("same\n")
    (view.host / "data.bin").write_bytes(b"\0\1\2")
    (view.host / "docs").mkdir()
    (view.host / "docs/a.md").write_text("a\n")
    (view.host / "docs/b.md").write_text("b\n")
    (view.host / "run.sh").write_text("echo\n")


def test_an_agents_edits_are_exactly_the_diff_and_the_host_is_untouched(view: View) -> None:
    _project(view)
    before = _tree(view.host)
    merged = view.merged
    (merged / "src/app.py").write_text("def main():\n    return 2\n")
    (merged / "src/new.py").write_text("print('new')\n")
    (merged / "old.txt").unlink()
    with open(merged / "same.txt", "a"):  # copied up, not changed
        pass
    (merged / "data.bin").write_bytes(b"\0\1\3")
    shutil.rmtree(merged / "docs")  # removed and made again: an opaque directory
    (merged / "docs").mkdir()
    (merged / "docs/a.md").write_text("a\n")
    os.chmod(merged / "run.sh", 0o755)
    (merged / "pkg/deep").mkdir(parents=True)
    (merged / "pkg/deep/x.txt").write_text("x")
    os.symlink("../README", merged / "src/readme-link")

    changes, truncated = projects.diff(view.upper, view.host)

    assert not truncated
    listed = [(c.path, c.action, c.kind) for c in changes]
    assert listed == [
        ("data.bin", "modified", "file"),
        ("docs/b.md", "deleted", "file"),
        ("old.txt", "deleted", "file"),
        ("pkg", "added", "dir"),
        ("pkg/deep", "added", "dir"),
        ("pkg/deep/x.txt", "added", "file"),
        ("run.sh", "modified", "file"),
        ("src/app.py", "modified", "file"),
        ("src/new.py", "added", "file"),
        ("src/readme-link", "added", "symlink"),
    ]
    by_path = {c.path: c for c in changes}
    assert by_path["src/app.py"].diff == (
        "--- a/src/app.py\n+++ b/src/app.py\n@@ -1,2 +1,2 @@\n def main():\n"
        "-    return 1\n+    return 2\n"
    )
    assert by_path["src/new.py"].diff == (
        "--- /dev/null\n+++ b/src/new.py\n@@ -0,0 +1 @@\n+print('new')\n"
    )
    assert by_path["old.txt"].diff == "--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-old\n"
    assert by_path["pkg/deep/x.txt"].diff is not None
    assert by_path["pkg/deep/x.txt"].diff.endswith("+x\n\\ No newline at end of file\n")
    assert by_path["data.bin"].binary and by_path["data.bin"].diff is None
    assert by_path["run.sh"].mode == 0o755 and by_path["run.sh"].diff == ""
    assert by_path["src/readme-link"].target == "../README"
    assert _tree(view.host) == before


def test_a_whiteout_over_nothing_and_a_touch_are_no_change(view: View) -> None:
    (view.host / "a").write_text("a")
    (view.merged / "tmp").write_text("t")
    (view.merged / "tmp").unlink()  # leaves nothing (or a whiteout) over no host entry
    os.utime(view.merged / "a", (1, 1))  # a copy-up with the same bytes and mode
    assert projects.diff(view.upper, view.host) == ([], False)


def test_the_host_files_content_the_owner_cannot_read_is_never_shown(view: View) -> None:
    os.chown(view.host, 4242, 4242)
    secret = view.host / "secret"
    secret.write_text("the host's secret\n")
    os.chown(secret, 0, 0)
    secret.chmod(0o600)
    (view.merged / "secret").unlink()  # the owner may remove it from its own directory
    (view.merged / "secret").write_text("mine\n")

    changes, _ = projects.diff(view.upper, view.host)

    (change,) = changes
    assert change.path == "secret" and change.action == "modified"
    assert change.diff is None and "not readable" in (change.note or "")
    assert "the host's secret" not in repr(changes)


def test_a_redirect_in_the_layer_is_refused_whole(view: View) -> None:
    (view.upper / "moved").mkdir()
    os.setxattr(view.upper / "moved", "user.overlay.redirect", b"/elsewhere")
    with pytest.raises(ProjectError):
        projects.diff(view.upper, view.host)


def test_a_symlink_as_the_source_is_never_followed(view: View) -> None:
    link = view.outside.parent / "link-to-host"
    link.symlink_to(view.host)
    with pytest.raises(OSError):
        projects.diff(view.upper, link)


def test_names_that_are_not_utf8_are_shown_escaped_and_synced_as_they_are(view: View) -> None:
    import json

    raw = os.fsencode(view.merged) + b"/caf\xe9.txt"
    with open(raw, "wb") as made:
        made.write(b"latin-1 name\n")
    os.symlink(b"target-\xff", os.fsencode(view.merged) + b"/link\xfe")

    changes, _ = projects.diff(view.upper, view.host)

    assert [(c.path, c.target) for c in changes] == [
        ("caf\\xe9.txt", None), ("link\\xfe", "target-\\xff"),
    ]  # fmt: skip
    json.dumps([c.model_dump(mode="json") for c in changes])  # no 500 for a hostile name
    applied, refused = projects.sync(view.upper, view.host, ["caf\\xe9.txt", "link\\xfe"])
    assert [c.path for c in applied] == ["caf\\xe9.txt", "link\\xfe"] and refused == []
    with open(os.fsencode(view.host) + b"/caf\xe9.txt", "rb") as synced:
        assert synced.read() == b"latin-1 name\n"
    assert os.readlink(os.fsencode(view.host) + b"/link\xfe") == b"target-\xff"


def test_many_directories_hold_no_descriptor_each(view: View) -> None:
    import resource

    for index in range(600):
        (view.merged / f"d{index}").mkdir()
        (view.merged / f"d{index}" / "f").write_text("x")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
    try:
        changes, _ = projects.diff(view.upper, view.host)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(changes) == 1200


def test_a_file_replacing_a_host_directory_says_the_directory_goes(view: View) -> None:
    (view.host / "d").mkdir()
    (view.host / "d/inner").write_text("inner\n")
    shutil.rmtree(view.merged / "d")
    (view.merged / "d").write_text("now a file\n")

    (change,) = projects.diff(view.upper, view.host)[0]

    assert (change.path, change.action, change.kind) == ("d", "modified", "file")
    assert change.note is not None and "replaces a directory" in change.note
    assert change.diff == "--- a/d\n+++ b/d\n@@ -0,0 +1 @@\n+now a file\n"
    projects.sync(view.upper, view.host, ["d"])
    assert (view.host / "d").read_text() == "now a file\n"


def _chain(root: Path, depth: int) -> None:
    """``depth`` nested directories ``d/d/d...`` made straight in ``root`` (the layer)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def test_a_deep_chain_of_directories_is_refused_fast_for_diff_and_sync(view: View) -> None:
    # The attack: one inode per level, so ~80k levels fit the default volume; reopening
    # each directory from the root and a depth-long tuple per change made that hours of
    # CPU and tens of GB. 1500 levels took the old walk ~8 s; the cap refuses in well
    # under a second, and a chain at the cap is read in linear time.
    _chain(view.upper, 1500)
    for run in (lambda: projects.diff(view.upper, view.host),
                lambda: projects.sync(view.upper, view.host, None)):  # fmt: skip
        started = time.monotonic()
        with pytest.raises(ProjectError, match="deeper than 256"):
            run()
        assert time.monotonic() - started < 2
    assert list(view.host.iterdir()) == []  # the refused sync wrote nothing


def test_a_chain_at_the_depth_cap_is_read_in_linear_time(tmp_path: Path) -> None:
    upper, host = tmp_path / "upper", tmp_path / "host"
    upper.mkdir()
    host.mkdir()
    _chain(upper, _changes.MAX_DEPTH)
    started = time.monotonic()
    changes, _ = projects.diff(upper, host)
    assert len(changes) == _changes.MAX_DEPTH
    assert time.monotonic() - started < 2


def test_a_huge_directory_is_refused_while_it_is_listed(
    view: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_changes, "MAX_ENTRIES", 100)
    for index in range(2000):
        (view.upper / f"f{index}").touch()
    looked = []
    real = _changes._fs.lstat_at
    monkeypatch.setattr(_changes._fs, "lstat_at", lambda *a: looked.append(a) or real(*a))
    with pytest.raises(ProjectError, match="more than 100 entries"):
        projects.diff(view.upper, view.host)
    assert looked == []  # refused while listing: not one name looked at


def test_many_deep_paths_are_refused_at_the_names_cap(
    view: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_changes, "MAX_COMPONENTS", 5000)
    _chain(view.upper, 100)
    deepest = view.upper / "/".join(["d"] * 100)
    for index in range(100):
        (deepest / f"f{index}").touch()  # 100 entries, each 101 names deep
    with pytest.raises(ProjectError, match="more than 5000 names"):
        projects.diff(view.upper, view.host)


_SWAPPED_DIFF = """
import sys, time
from pathlib import Path
from ringfence import projects
base = Path(sys.argv[1])
lines = [f"{i:x}\\n" for i in range(16000)]
(base / "host/data.txt").write_text("".join(lines))
swapped = [x for pair in zip(lines[1::2], lines[0::2]) for x in pair]
(base / "upper/data.txt").write_text("".join(swapped))
(change,), _ = projects.diff(base / "upper", base / "host")
print(change.note)
"""


def test_a_file_whose_lines_are_swapped_gets_no_diff_and_costs_no_time(tmp_path: Path) -> None:
    # The attack: 16,000 swapped adjacent lines (75 KB, well under the 1 MiB cap) cost
    # difflib 83 s of one core. Run in a child killed after 10 s, so the old cost shows
    # as a timeout, not a hung suite.
    (tmp_path / "host").mkdir()
    (tmp_path / "upper").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _SWAPPED_DIFF, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    assert done.stdout.startswith("diff too large to show")


def test_no_diff_is_computed_once_the_answers_budget_is_spent(
    view: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_diff, "MAX_DIFF_BYTES", 1000)
    for index in range(50):
        (view.merged / f"f{index:02}.txt").write_text("x\n" * 100)  # ~230 chars of diff each
    computed = []
    real = _diff.difflib.unified_diff
    monkeypatch.setattr(
        _diff.difflib, "unified_diff", lambda *a, **k: computed.append(1) or real(*a, **k)
    )
    changes, truncated = projects.diff(view.upper, view.host)
    assert truncated and len(changes) == 50
    assert len(computed) <= 5  # not 50: the rest were never computed
    assert all("cap" in (c.note or "") for c in changes if c.diff is None)


def test_shown_names_are_one_to_one_and_hide_nothing(view: View) -> None:
    # The attacks: the literal name 'caf\xe9.txt' (a backslash) and the byte name
    # caf<0xE9>.txt were both shown 'caf\xe9.txt', and selecting one synced the other; a
    # name with an escape sequence or a newline faked or erased lines in a listing.
    merged = os.fsencode(view.merged)
    with open(merged + b"/caf\\xe9.txt", "wb") as literal:
        literal.write(b"benign\n")
    with open(merged + b"/caf\xe9.txt", "wb") as raw:
        raw.write(b"hostile\n")
    with open(merged + b"/x\x1b[1A\x1b[2K\ny\r\xe2\x80\xae.txt", "wb") as sneaky:
        sneaky.write(b"s\n")
    changes, _ = projects.diff(view.upper, view.host)
    paths = sorted(change.path for change in changes)
    assert paths == [
        "caf\\\\xe9.txt",
        "caf\\xe9.txt",
        "x\\u001b[1A\\u001b[2K\\u000ay\\u000d\\u202e.txt",
    ]
    assert all(char.isprintable() for path in paths for char in path)

    applied, refused = projects.sync(view.upper, view.host, ["caf\\\\xe9.txt"])
    assert [c.path for c in applied] == ["caf\\\\xe9.txt"] and refused == []
    assert sorted(os.listdir(os.fsencode(view.host))) == [b"caf\\xe9.txt"]  # only the benign
