"""The process service against a real daemon and real processes."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Daemon, b64, output, wait_for

START = "process.Process/Start"


def sh(script: str, **extra: Any) -> dict[str, Any]:
    return {"process": {"cmd": "/bin/sh", "args": ["-c", script]}, **extra}


def end_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert events[-1] == {"_end": {}}, events[-1]
    end: dict[str, Any] = events[-2]["event"]["end"]
    return end


def test_start_streams_output_before_the_process_ends(daemon: Daemon) -> None:
    stream = daemon.stream(START, sh("echo 1; read _ < /dev/null; sleep 0.3; echo 2 >&2"))
    first = next(stream)
    assert "pid" in first["event"]["start"]
    second = next(stream)
    assert base64.b64decode(second["event"]["data"]["stdout"]) == b"1\n"
    # The process is still running: it has not printed its stderr line yet.
    rest = [first, second, *stream]
    assert output(rest, "stderr") == b"2\n"
    assert end_of(rest) == {"exitCode": 0, "exited": True, "status": "exit status 0"}


def test_start_with_a_late_end_of_the_request_body(daemon: Daemon) -> None:
    events = list(daemon.stream(START, sh("echo late"), end_after=0.1))
    assert output(events) == b"late\n"
    assert end_of(events)["exitCode"] == 0


def test_exit_code_env_and_cwd(daemon: Daemon) -> None:
    (daemon.home / "work").mkdir(exist_ok=True)
    events = list(
        daemon.stream(
            START,
            {
                "process": {
                    "cmd": "/bin/sh",
                    "args": ["-c", 'echo "$GREETING"; pwd; exit 3'],
                    "envs": {"GREETING": "hello"},
                    "cwd": "work",
                }
            },
        )
    )
    assert output(events) == f"hello\n{daemon.home / 'work'}\n".encode()
    assert end_of(events)["exitCode"] == 3
    default = list(daemon.stream(START, sh("pwd")))
    assert output(default) == f"{daemon.home}\n".encode()


def test_missing_program_or_cwd_is_invalid_argument(daemon: Daemon) -> None:
    events = list(daemon.stream(START, {"process": {"cmd": "no-such-program"}}))
    assert events[-1]["_end"]["error"]["code"] == "invalid_argument"
    events = list(daemon.stream(START, {"process": {"cmd": "/bin/true", "cwd": "/nope"}}))
    assert events[-1]["_end"]["error"]["code"] == "invalid_argument"


def test_root_is_refused(daemon: Daemon) -> None:
    root = "Basic " + b64(b"root:")
    events = list(daemon.stream(START, sh("id"), authorization=root))
    assert events == [{"_end": {"error": events[0]["_end"]["error"]}}]
    assert events[0]["_end"]["error"]["code"] == "permission_denied"
    assert events[0]["_end"]["error"]["message"] == (
        "user 'root' is not available: this sandbox runs everything as its one "
        "unprivileged user 'user'"
    )
    user = "Basic " + b64(b"user:")
    assert end_of(list(daemon.stream(START, sh("true"), authorization=user)))["exited"]
    response = daemon.unary("process.Process/List", {}, authorization=root)
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"


def test_deadline_kills_the_process_group(daemon: Daemon) -> None:
    marker = daemon.home / "grandchild-survived"
    script = f"(sleep 3; touch {marker}) & sleep 30"
    # The header's deadline is the stream's: it ends as envd's does when its context
    # expires, with deadline_exceeded (the E2B SDKs' TimeoutException), not an end event.
    events = list(daemon.stream(START, sh(script), **{"connect-timeout-ms": "300"}))
    assert events[-1]["_end"]["error"]["code"] == "deadline_exceeded", events[-1]
    assert "timeout" in events[-1]["_end"]["error"]["message"]
    assert not any("end" in e.get("event", {}) for e in events)
    # timeoutMs (Ringfence's): the process's own, so its end event says what happened.
    events = list(daemon.stream(START, sh("sleep 30", timeoutMs="200")))
    end = end_of(events)
    assert end["exited"] is False and end["status"] == "signal: killed"
    assert "timed out" in end["error"]


def test_background_process_connect_and_list(daemon: Daemon) -> None:
    stream = daemon.stream(START, sh("read line; echo got $line", stdin=True, tag="bg"))
    pid = next(stream)["event"]["start"]["pid"]
    stream.close()  # leaving the Start stream does not kill the process
    listed = daemon.unary("process.Process/List", {}).json()["processes"]
    mine = [p for p in listed if p["pid"] == pid]
    assert mine and mine[0]["tag"] == "bg" and mine[0]["config"]["cmd"] == "/bin/sh"
    attached = daemon.stream("process.Process/Connect", {"process": {"tag": "bg"}})
    assert next(attached)["event"]["start"]["pid"] == pid
    sent = daemon.unary(
        "process.Process/SendInput", {"process": {"pid": pid}, "input": {"stdin": b64(b"x\n")}}
    )
    assert sent.status_code == 200, sent.text
    events = list(attached)
    assert output(events) == b"got x\n"
    assert end_of(events)["exitCode"] == 0

    def left_list() -> bool:
        processes = daemon.unary("process.Process/List", {}).json()["processes"]
        return all(p["pid"] != pid for p in processes)

    wait_for(left_list)


def test_close_stdin_ends_cat(daemon: Daemon) -> None:
    stream = daemon.stream(START, {"process": {"cmd": "cat"}, "stdin": True})
    pid = next(stream)["event"]["start"]["pid"]
    selector = {"process": {"pid": str(pid)}}
    daemon.unary("process.Process/SendInput", {**selector, "input": {"stdin": b64(b"abc")}})
    assert daemon.unary("process.Process/CloseStdin", selector).status_code == 200
    events = list(stream)
    assert output(events) == b"abc"
    assert end_of(events)["exitCode"] == 0


def test_stream_input(daemon: Daemon) -> None:
    stream = daemon.stream(START, {"process": {"cmd": "cat"}, "stdin": True})
    pid = next(stream)["event"]["start"]["pid"]
    frames = b""
    for msg in (
        {"start": {"process": {"pid": pid}}},
        {"data": {"input": {"stdin": b64(b"one ")}}},
        {"keepalive": {}},
        {"data": {"input": {"stdin": b64(b"two")}}},
    ):
        payload = json.dumps(msg).encode()
        frames += struct.pack(">BI", 0, len(payload)) + payload
    response = daemon.client.post(
        "/process.Process/StreamInput",
        content=iter([frames]),
        headers={"content-type": "application/connect+json"},
    )
    assert response.status_code == 200
    daemon.unary("process.Process/CloseStdin", {"process": {"pid": pid}})
    assert output(list(stream)) == b"one two"


def test_sigkill_reaches_grandchildren(daemon: Daemon) -> None:
    stream = daemon.stream(START, sh("sleep 60 & echo $!; wait"))
    pid = next(stream)["event"]["start"]["pid"]
    grandchild = int(base64.b64decode(next(stream)["event"]["data"]["stdout"]))
    response = daemon.unary(
        "process.Process/SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
    )
    assert response.status_code == 200
    end = end_of(list(stream))
    assert end["status"] == "signal: killed"

    def gone() -> bool:
        try:
            with open(f"/proc/{grandchild}/stat") as f:
                return f.read().split(") ")[1].startswith("Z")
        except FileNotFoundError:
            return True

    wait_for(gone)


def test_unknown_pid_is_not_found(daemon: Daemon) -> None:
    events = list(daemon.stream("process.Process/Connect", {"process": {"pid": 999999}}))
    assert events[-1]["_end"]["error"]["code"] == "not_found"
    for method in ("SendSignal", "CloseStdin"):
        body = {"process": {"pid": 999999}, "signal": "SIGNAL_SIGTERM"}
        response = daemon.unary(f"process.Process/{method}", body)
        assert (response.status_code, response.json()["code"]) == (404, "not_found")


def test_listening_fd_is_not_inherited(daemon: Daemon) -> None:
    events = list(daemon.stream(START, {"process": {"cmd": "ls", "args": ["/proc/self/fd"]}}))
    fds = sorted(int(x) for x in output(events).split())
    assert fds[:3] == [0, 1, 2]
    assert len(fds) == 4  # ls's own directory fd


def test_keepalives_while_idle(daemon: Daemon) -> None:
    started = time.monotonic()
    events = list(daemon.stream(START, sh("sleep 0.5"), **{"keepalive-ping-interval": "0.1"}))
    assert any("keepalive" in e.get("event", {}) for e in events)
    assert time.monotonic() - started < 10
    assert os.path.exists(daemon.path)


def test_commands_start_with_no_signal_the_server_had_ignored(tmp_path: Path) -> None:
    """A daemon started with SIGHUP, SIGINT and SIGQUIT ignored (a server run by nohup, or
    as a shell's background job) starts its commands with every signal at its default: a
    shell in the sandbox can trap SIGINT, and ^C reaches a terminal's program."""
    import signal

    def ignored() -> None:
        for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_IGN)

    home = tmp_path / "home"
    home.mkdir()
    original = subprocess.Popen.__init__

    def popen(self: subprocess.Popen[bytes], *args: Any, **kwargs: Any) -> None:
        original(self, *args, preexec_fn=ignored, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", popen)
        daemon = Daemon(tmp_path, home)
    try:
        wait_for(lambda: daemon.client.get("/health").status_code == 204)
        assert int(_field(daemon.pid, "SigIgn"), 16) & 0b1111 == 0, "the daemon's own"
        script = "grep SigIgn /proc/self/status; sh -c 'trap \"echo trapped\" INT; kill -INT $$'"
        out = output(list(daemon.stream(START, sh(script)))).decode()
        ignored_mask = int(out.splitlines()[0].split()[1], 16)
        assert ignored_mask & 0b1111 == 0, out  # HUP INT QUIT (bits 0-2) and no others low
        assert out.splitlines()[1:] == ["trapped"], out
    finally:
        daemon.client.close()
        daemon.proc.kill()
        daemon.proc.wait()


def _field(pid: int, key: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split()[1]
    raise KeyError(key)
