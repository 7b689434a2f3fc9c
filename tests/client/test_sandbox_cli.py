"""``ringfence sandbox`` and ``ringfence files`` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.client.conftest import LiveServer
from tests.server.test_serve_process import RINGFENCE


def _cli(
    live: LiveServer, *args: str, key: str | None = None, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "RINGFENCE_URL": live.url, "RINGFENCE_API_KEY": key or live.key}
    return subprocess.run([RINGFENCE, *args], env=env, input=stdin, capture_output=True, timeout=60)


@pytest.mark.every_store
def test_create_exec_files_list_kill(live: LiveServer, tmp_path: Path) -> None:
    created = _cli(live, "sandbox", "create", "--metadata", "cli=yes", "--memory", "256M")
    assert created.returncode == 0, created.stderr
    sid = created.stdout.decode().strip()
    try:
        listing = _cli(live, "sandbox", "list", "--metadata", "cli=yes")
        assert sid in listing.stdout.decode() and "cli=yes" in listing.stdout.decode()
        records = json.loads(_cli(live, "sandbox", "list", "--json", "--state", "running").stdout)
        assert sid in [r["id"] for r in records]

        ran = _cli(
            live, "sandbox", "exec", sid, "--env", "X=1", "--", "bash", "-c",
            'echo "out $X"; echo err >&2; exit 7',
        )  # fmt: skip
        assert (ran.returncode, ran.stdout, ran.stderr) == (7, b"out 1\n", b"err\n")
        late = _cli(live, "sandbox", "exec", sid, "--timeout", "0.3", "--", "sleep", "30")
        assert late.returncode == 124 and b"timed out" in late.stderr

        wrote = _cli(live, "files", "write", sid, "in/data.bin", stdin=b"\x00\x01bytes")
        assert wrote.returncode == 0 and wrote.stdout == b"/home/user/in/data.bin\n"
        source = tmp_path / "local.txt"
        source.write_text("from a file")
        assert _cli(live, "files", "write", sid, "in/local.txt", str(source)).returncode == 0
        assert _cli(live, "files", "read", sid, "in/data.bin").stdout == b"\x00\x01bytes"
        saved = tmp_path / "saved.txt"
        assert _cli(live, "files", "read", sid, "in/local.txt", "-o", str(saved)).returncode == 0
        assert saved.read_text() == "from a file"
        listed = _cli(live, "files", "ls", sid, "in")
        assert b"/home/user/in/data.bin" in listed.stdout
        entries = json.loads(_cli(live, "files", "ls", sid, "--depth", "2", "--json").stdout)
        assert {"/home/user/in", "/home/user/in/local.txt"} <= {e["path"] for e in entries}

        assert _cli(live, "sandbox", "set-timeout", sid, "120").returncode == 0
        missing = _cli(live, "files", "read", sid, "nope")
        assert missing.returncode == 1 and b"nope" in missing.stderr
    finally:
        killed = _cli(live, "sandbox", "kill", sid)
    assert killed.returncode == 0 and killed.stdout.decode().split() == [sid, "killed"]
    ended = _cli(live, "sandbox", "exec", sid, "--", "true")
    assert ended.returncode == 125 and b"Traceback" not in ended.stderr


def test_errors_are_one_clear_line(live: LiveServer) -> None:
    for args in (
        ("sandbox", "kill", "sb-does-not-exist"),
        ("sandbox", "exec", "sb-does-not-exist", "--", "true"),
        ("files", "ls", "sb-does-not-exist"),
    ):
        done = _cli(live, *args)
        assert done.returncode != 0, args
        assert b"Traceback" not in done.stderr
        assert b"no sandbox with id 'sb-does-not-exist'" in done.stderr, done.stderr
    created = _cli(live, "sandbox", "create", "--timeout", "-5")
    assert created.returncode == 2 and b"Traceback" not in created.stderr
    wrong_key = _cli(live, "sandbox", "list", key="rf_0000000000000000_" + "A" * 43)
    assert wrong_key.returncode == 1 and b"Traceback" not in wrong_key.stderr
