"""``ringfence template`` as a user runs it: import, list, rm, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.templates._images import busybox_layers, docker_archive

RINGFENCE = str(Path(sys.executable).parent / "ringfence")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RINGFENCE, "template", *args], capture_output=True, text=True, timeout=60
    )


def test_import_list_and_remove(open_tmp: Path) -> None:
    data = ["--data-dir", str(open_tmp / "data")]
    archive = docker_archive(open_tmp / "image.tar", busybox_layers())
    imported = _run("import", "bb", str(archive), *data)
    assert imported.returncode == 0, imported.stderr
    assert "1 device nodes skipped" in imported.stdout
    listed = json.loads(_run("list", "--json", *data).stdout)
    assert [(t["name"], t["source"], t["tags"]) for t in listed] == [
        ("bb", "import", ["test/image:latest"])
    ]
    assert Path(listed[0]["rootfs"], "bin", "busybox").is_file()
    table = _run("list", *data).stdout.splitlines()
    assert table[0].split() == ["NAME", "SOURCE", "SIZE", "CREATED"] and table[1].startswith("bb ")
    removed = _run("rm", "bb", *data)
    assert removed.returncode == 0, removed.stderr
    assert json.loads(_run("list", "--json", *data).stdout) == []
    assert not list((open_tmp / "ringfence-templates").iterdir()), "nothing left behind"


def test_bad_input_exits_non_zero_with_one_line(open_tmp: Path) -> None:
    data = ["--data-dir", str(open_tmp / "data")]
    junk = open_tmp / "junk.tar"
    junk.write_text("not a tar\n")
    cases = {
        ("import", "x", str(junk)): 2,  # not a tar
        ("import", "x", str(open_tmp / "missing.tar")): 2,
        ("import", "Bad_Name", str(junk)): 2,
        ("rm", "unknown"): 1,
        ("build", "x", "--packages", "not a package", "--recipe", "minbase"): 2,
    }
    for args, code in cases.items():
        done = _run(*args, *data)
        assert done.returncode == code, (args, done.stderr)
        assert done.stderr.startswith("ringfence: ") and len(done.stderr.splitlines()) == 1, args
        assert "Traceback" not in done.stderr
