"""``ringfence sandbox checkpoint|rollback|pause|resume|fork|snapshot`` as a user runs them."""

from __future__ import annotations

import json

from tests.client.conftest import LiveServer
from tests.client.test_sandbox_cli import _cli


def test_state_commands(live: LiveServer) -> None:
    created = _cli(live, "sandbox", "create", "--timeout", "300")
    assert created.returncode == 0, created.stderr
    sid = created.stdout.decode().strip()
    made: list[str] = [sid]
    try:
        assert _cli(live, "files", "write", sid, "f", stdin=b"one").returncode == 0
        checkpoint = _cli(live, "sandbox", "checkpoint", sid)
        assert checkpoint.returncode == 0, checkpoint.stderr
        cid = checkpoint.stdout.decode().strip()
        assert cid in _cli(live, "sandbox", "checkpoints", sid).stdout.decode()
        assert _cli(live, "files", "write", sid, "f", stdin=b"two").returncode == 0
        assert _cli(live, "sandbox", "rollback", sid, cid).returncode == 0
        assert _cli(live, "files", "read", sid, "f").stdout == b"one"
        unknown = _cli(live, "sandbox", "rollback", sid, "ck0")
        assert unknown.returncode == 1 and len(unknown.stderr.splitlines()) == 1, unknown.stderr

        paused = _cli(live, "sandbox", "pause", sid)
        assert paused.returncode == 0 and b"memory freed" in paused.stdout, paused.stderr
        listed = json.loads(_cli(live, "sandbox", "list", "--json", "--state", "paused").stdout)
        assert sid in [s["id"] for s in listed]
        resumed = _cli(live, "sandbox", "resume", sid)
        assert resumed.stdout.decode().strip() == f"{sid} running", resumed.stderr

        forked = _cli(live, "sandbox", "fork", sid, "-n", "2")
        assert forked.returncode == 0, forked.stderr
        children = forked.stdout.decode().split()
        made += children
        assert len(set(children)) == 2 and sid not in children
        assert _cli(live, "sandbox", "fork", sid, "-n", "0").returncode == 2

        snapshot = _cli(live, "sandbox", "snapshot", "create", sid)
        assert snapshot.returncode == 0, snapshot.stderr
        snap = snapshot.stdout.decode().strip()
        assert snap in _cli(live, "sandbox", "snapshot", "list").stdout.decode()
        started = _cli(live, "sandbox", "create", "--snapshot", snap)
        assert started.returncode == 0, started.stderr
        made.append(started.stdout.decode().strip())
        assert _cli(live, "files", "read", made[-1], "f").stdout == b"one"
        assert _cli(live, "sandbox", "snapshot", "delete", snap).returncode == 0
        gone = _cli(live, "sandbox", "snapshot", "delete", snap)
        assert gone.returncode == 1 and len(gone.stderr.splitlines()) == 1
    finally:
        for made_id in made:
            _cli(live, "sandbox", "kill", made_id)
