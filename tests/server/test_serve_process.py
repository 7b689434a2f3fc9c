"""``ringfence serve`` as a real process on a loopback port, killed and restarted."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

RINGFENCE = str(Path(sys.executable).parent / "ringfence")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    def __init__(
        self, data_dir: Path, database_url: str | None, env: dict[str, str] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.database_url = database_url
        self.env = {**os.environ, **(env or {})}
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[str] | None = None
        # Everything the server printed, read as it comes: an unread pipe fills at 64 KiB and
        # then blocks the server's event loop in write(), so a long-lived server that logs
        # enough (a suite's worth of requests) stopped answering every test after it.
        self._output: list[str] = []
        self._reader: threading.Thread | None = None

    @property
    def output(self) -> str:
        """What the server has printed so far (stdout and stderr)."""
        return "".join(self._output)

    @property
    def lines(self) -> list[str]:
        """What the server has printed so far, one line an item (a copy)."""
        return list(self._output)

    def args(self) -> list[str]:
        extra = ["--database-url", self.database_url] if self.database_url else []
        return ["--data-dir", str(self.data_dir), *extra]

    def start(self) -> None:
        self.process = subprocess.Popen(
            [RINGFENCE, "serve", "--port", str(self.port), *self.args()],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        self._output = []
        self._reader = threading.Thread(
            target=_drain, args=(self.process, self._output), daemon=True
        )
        self._reader.start()
        for _ in range(300):
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                self._reader.join(timeout=10)
                raise AssertionError(self.output)
            time.sleep(0.05)
        raise AssertionError("the server did not come up")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> str:
        """Stop the server (SIGTERM) and return everything it printed."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)
        if self._reader is not None:
            self._reader.join(timeout=10)  # the pipe's end: the server has exited
        return self.output


def _drain(process: subprocess.Popen[str], into: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        into.append(line)


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """A server on SQLite in its data directory, or on a fresh PostgreSQL database."""
    url = request.getfixturevalue("postgres_database") if request.param == "postgres" else None
    server = Server(tmp_path / "data", url)
    yield server
    if server.process is not None and server.process.poll() is None:
        server.kill()


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.mark.every_store
def test_first_start_makes_an_admin_key_and_serves_executions(server: Server) -> None:
    server.start()
    key_file = server.data_dir / "admin-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    admin = {"Authorization": f"Bearer {key_file.read_text().strip()}"}
    assert httpx.get(f"{server.url}/v1/whoami", headers=admin).json()["role"] == "admin"
    response = httpx.post(
        f"{server.url}/v1/executions",
        headers=admin,
        timeout=30,
        json={"id": "first", "command": ["python3", "-c", "print(1)"]},
    )
    assert response.json()["status"] == "succeeded" and response.json()["logs"] == "1\n"
    output = server.stop()
    assert str(key_file) in output, "the first start says where the key is"


@pytest.mark.every_store
def test_keys_create_mints_a_key_for_another_tenant(server: Server) -> None:
    server.start()
    minted = subprocess.run(
        [RINGFENCE, "keys", "create", "--tenant", "globex", *server.args()],
        capture_output=True,
        text=True,
        check=True,
    )
    key = minted.stdout.strip()
    assert minted.stdout.count("\n") == 1 and key.startswith("rf_")
    other = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{server.url}/v1/whoami", headers=other).json()["tenant"] == "globex"
    bad = subprocess.run(
        [RINGFENCE, "keys", "create", "--tenant", "Not A Label", *server.args()],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "tenant" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.every_store
def test_a_killed_server_loses_nothing_and_leaves_no_sandbox_behind(server: Server) -> None:
    server.start()
    admin = {"Authorization": f"Bearer {(server.data_dir / 'admin-key').read_text().strip()}"}
    done = httpx.post(
        f"{server.url}/v1/executions",
        headers=admin,
        timeout=30,
        json={"id": "done", "command": ["true"]},
    ).json()
    marker = f"ringfence-orphan-{uuid.uuid4().hex}"
    for i in range(3):
        httpx.post(
            f"{server.url}/v1/executions?wait=false",
            headers=admin,
            json={"id": f"cut-{i}", "command": ["sh", "-c", f"sleep 600; echo {marker}"]},
        )
    for _ in range(500):
        states = [
            httpx.get(f"{server.url}/v1/executions/cut-{i}", headers=admin).json()["status"]
            for i in range(3)
        ]
        if states == ["running"] * 3:
            break
        time.sleep(0.02)
    assert len(_processes_with(marker)) >= 3, "the sandboxes run"
    server.kill()
    for _ in range(500):
        if not _processes_with(marker):
            break
        time.sleep(0.01)
    assert _processes_with(marker) == [], "no sandbox process outlives the server"
    server.start()
    listed = httpx.get(f"{server.url}/v1/executions", headers=admin).json()
    by_id = {r["execution_id"]: r for r in listed}
    assert by_id["done"] == done, "finished results survive the crash"
    for i in range(3):
        cut = by_id[f"cut-{i}"]
        assert cut["status"] == "failed" and "server stopped" in cut["error"], cut
        assert cut["started_at"] is not None, "when it started is not lost"
    assert json.loads(json.dumps(listed))  # the listing stays valid JSON after reconcile


def test_sigterm_answers_waiting_clients_and_stops_promptly(server: Server) -> None:
    import threading

    server.start()
    admin = {"Authorization": f"Bearer {(server.data_dir / 'admin-key').read_text().strip()}"}
    answers: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{server.url}/v1/executions", headers=admin, timeout=60,
        json={"id": "waited", "command": ["sleep", "60"]},
    )))  # fmt: skip
    waiting.start()
    for _ in range(500):
        state = httpx.get(f"{server.url}/v1/executions/waited", headers=admin)
        if state.status_code == 200 and state.json()["status"] == "running":
            break
        time.sleep(0.02)
    assert server.process is not None
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=30)
    waiting.join(timeout=30)
    assert time.monotonic() - started < 5, "no waiting for the execution's own timeout"
    assert answers and answers[0].status_code == 200
    assert answers[0].json()["status"] == "cancelled"
    server.start()
    stored = httpx.get(f"{server.url}/v1/executions/waited", headers=admin).json()
    assert stored["status"] == "cancelled", "the outcome was stored before the exit"


@pytest.mark.every_store
def test_a_killed_server_leaves_no_sandbox_and_marks_its_sandboxes_failed(
    server: Server,
) -> None:
    """SIGKILL in the middle of running commands in interactive sandboxes, then a restart."""
    from tests.server._envd import STREAM, start_body

    server.start()
    admin = {"Authorization": f"Bearer {(server.data_dir / 'admin-key').read_text().strip()}"}
    marker = f"ringfence-orphan-{uuid.uuid4().hex}"
    ids = []
    for i in range(3):
        created = httpx.post(
            f"{server.url}/v1/sandboxes",
            headers=admin,
            timeout=30,
            json={"metadata": {"n": str(i)}},
        )
        assert created.status_code == 201, created.text
        ids.append(created.json()["id"])
        # Background and foreground commands, one still streaming when the server dies.
        httpx.post(
            f"{server.url}/v1/sandboxes/{ids[-1]}/rpc/process.Process/Start",
            headers={**admin, **STREAM},
            content=start_body(["sh", "-c", f"(sleep 600; echo {marker}) & echo started"]),
            timeout=30,
        )
    streaming = httpx.Client(timeout=30)
    with streaming.stream(
        "POST",
        f"{server.url}/v1/sandboxes/{ids[0]}/rpc/process.Process/Start",
        headers={**admin, **STREAM},
        content=start_body(["sh", "-c", f"echo {marker}-fg; sleep 600"]),
    ) as running:
        next(running.iter_raw())  # the command has started
        assert len(_processes_with(marker)) >= 4, "the sandboxes' commands run"
        server.kill()
    streaming.close()
    for _ in range(500):
        if not _processes_with(marker):
            break
        time.sleep(0.01)
    assert _processes_with(marker) == [], "no sandbox process outlives the server"
    assert server.process is not None
    dead = server.process.pid
    server.start()
    # The dead one's own directory: other test processes (xdist workers, other runs on
    # this host) may have killed servers of theirs whose restart has not swept yet.
    sockets = Path("/run/ringfence/sockets")
    stale = [p for p in sockets.iterdir() if p.name == f"i{dead}"]
    assert stale == [], "the restarted server swept the dead one's sockets"
    listed = httpx.get(f"{server.url}/v1/sandboxes", headers=admin).json()
    assert sorted(s["id"] for s in listed) == sorted(ids), "no recorded sandbox is lost"
    for sandbox in listed:
        assert sandbox["state"] == "failed" and "server stopped" in sandbox["error"], sandbox
        assert sandbox["metadata"] == {"n": str(ids.index(sandbox["id"]))}
    gone = httpx.post(
        f"{server.url}/v1/sandboxes/{ids[0]}/rpc/process.Process/List", headers=admin, json={}
    )
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "sandbox_not_running"


@pytest.mark.every_store
def test_a_server_refuses_another_seal_key_than_its_logs(server: Server) -> None:
    server.start()
    server.stop()  # sealed at shutdown, by the data directory's key
    key_file = server.data_dir / "audit-seal-key"
    key_file.unlink()  # lost, and about to be made anew
    refused = subprocess.run(
        [RINGFENCE, "serve", "--port", str(server.port), *server.args()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 125, refused.stderr
    assert "sealed by the key" in refused.stderr and "Traceback" not in refused.stderr


def test_a_second_server_on_the_same_data_dir_refuses_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """``scripts/start`` twice: the second server took the first's running sandboxes for
    the remains of a crash and marked them failed, then failed to bind its port."""
    first = Server(tmp_path / "data", None)
    first.start()
    try:
        admin = {"Authorization": f"Bearer {(first.data_dir / 'admin-key').read_text().strip()}"}
        created = httpx.post(f"{first.url}/v1/sandboxes", headers=admin, timeout=30, json={})
        assert created.status_code == 201, created.text
        sandbox = created.json()["id"]
        assert first.process is not None
        for port in (first.port, _free_port()):  # its own port (scripts/start) or another
            second = subprocess.run(
                [RINGFENCE, "serve", "--port", str(port), *first.args()],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert second.returncode == 125, second.stderr
            assert second.stderr.count("\n") == 1, second.stderr
            assert f"pid {first.process.pid}" in second.stderr, second.stderr
            assert str(first.data_dir) in second.stderr, second.stderr
        state = httpx.get(f"{first.url}/v1/sandboxes/{sandbox}", headers=admin).json()
        assert state["state"] == "running", state
        listed = httpx.post(
            f"{first.url}/v1/sandboxes/{sandbox}/rpc/process.Process/List",
            headers=admin,
            json={},
            timeout=30,
        )
        assert listed.status_code == 200, listed.text
    finally:
        first.stop()


def test_a_taken_port_is_refused_before_the_store_is_touched(tmp_path: Path) -> None:
    """A port already bound fails the start in one line, before any reconcile."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = subprocess.run(
            [RINGFENCE, "serve", "--port", str(port), "--data-dir", str(tmp_path / "data")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert refused.returncode == 125, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert not (tmp_path / "data" / "ringfence.db").exists(), "no store was opened"


def test_a_server_that_logs_more_than_a_pipe_holds_keeps_answering(tmp_path: Path) -> None:
    """The harness reads the server's output as it comes: a suite-long server logs far more
    than a pipe's 64 KiB, and an unread pipe blocked its event loop in write()."""
    server = Server(tmp_path / "data", None)
    server.start()
    try:
        long_path = "/v1/no-such-route-" + "x" * 4000  # each request logs it: 4 KiB a line
        with httpx.Client(base_url=server.url, timeout=10) as client:
            for _ in range(48):  # ~190 KiB of log, three pipes' worth
                assert client.get(long_path).status_code == 404
            assert client.get("/v1/health").status_code == 200
    finally:
        output = server.stop()
    assert len(output) >= 128 * 1024
