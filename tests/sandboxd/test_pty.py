"""Terminals (``Start`` with ``pty``) against a real daemon and real pseudo-terminals."""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator
from typing import Any

from ringfence.sandboxd import _pty

from .conftest import Daemon, b64, output, wait_for

START = "process.Process/Start"
CONNECT = "process.Process/Connect"
PTY = {"size": {"rows": 24, "cols": 80}}


def terminal(daemon: Daemon, cmd: str, *args: str, **size: int) -> tuple[int, Iterator[Any]]:
    """A process on a new terminal: its pid and its open event stream."""
    pty = {"size": size} if size else PTY
    stream = daemon.stream(START, {"process": {"cmd": cmd, "args": list(args)}, "pty": pty})
    first = next(stream)
    assert "start" in first.get("event", {}), first
    return first["event"]["start"]["pid"], stream


def read_until(stream: Iterator[Any], needle: bytes) -> bytes:
    """The terminal's output up to and including ``needle`` (the stream's own deadline bounds
    the wait: it fails the test rather than hang)."""
    seen = b""
    for message in stream:
        data = message.get("event", {}).get("data", {})
        assert "stdout" not in data and "stderr" not in data, "a terminal has one stream"
        if "pty" in data:
            seen += base64.b64decode(data["pty"])
            if needle in seen:
                return seen
        assert "_end" not in message and "end" not in message.get("event", {}), seen
    raise AssertionError(f"the stream ended before {needle!r}: {seen!r}")


def send(daemon: Daemon, pid: int, data: bytes, field: str = "pty") -> Any:
    body = {"process": {"pid": pid}, "input": {field: b64(data)}}
    return daemon.unary("process.Process/SendInput", body)


def resize(daemon: Daemon, pid: int, rows: int, cols: int) -> Any:
    body = {"process": {"pid": pid}, "pty": {"size": {"rows": rows, "cols": cols}}}
    return daemon.unary("process.Process/Update", body)


def end_of(stream: Iterator[Any]) -> dict[str, Any]:
    rest = list(stream)
    assert rest[-1] == {"_end": {}}, rest[-1]
    end: dict[str, Any] = rest[-2]["event"]["end"]
    return end


def test_a_terminal_has_its_size_and_is_the_controlling_tty(daemon: Daemon) -> None:
    script = "stty size; tty; test -t 0 && test -t 1 && test -t 2 && echo all-ttys; exit 7"
    events = list(
        daemon.stream(START, {"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "pty": PTY})
    )
    seen = output(events, "pty")
    assert b"24 80\r\n" in seen and b"/dev/pts/" in seen and b"all-ttys" in seen
    assert output(events, "stdout") == output(events, "stderr") == b""
    end = events[-2]["event"]["end"]
    assert (end["exitCode"], end["exited"]) == (7, True)


def test_input_is_echoed_and_ctrl_d_ends_cat(daemon: Daemon) -> None:
    pid, stream = terminal(daemon, "cat")
    assert send(daemon, pid, b"hello\n").status_code == 200
    # The line discipline echoes the line, then cat writes it back: twice, with CRLF.
    assert read_until(stream, b"hello\r\nhello\r\n").count(b"hello") == 2
    assert send(daemon, pid, b"\x04").status_code == 200
    end = end_of(stream)
    assert (end.get("exitCode", 0), end["exited"]) == (0, True)


def test_resize_reaches_the_process_as_sigwinch(daemon: Daemon) -> None:
    code = (
        "import os, signal\n"  # os.write: a buffered print may be mid-flush at the signal
        "def winch(*_):\n"
        "    size = os.get_terminal_size(0)\n"
        "    os.write(1, f'size {size.lines}x{size.columns}\\n'.encode())\n"
        "signal.signal(signal.SIGWINCH, winch)\n"
        "os.write(1, b'ready\\n')\n"
        "while True: signal.pause()\n"
    )
    pid, stream = terminal(daemon, sys.executable, "-c", code, rows=10, cols=20)
    read_until(stream, b"ready")
    assert resize(daemon, pid, 40, 132).status_code == 200
    assert b"size 40x132" in read_until(stream, b"size 40x132")
    kill(daemon, pid)
    assert end_of(stream)["status"] == "signal: killed"


def test_several_watchers_see_the_same_output_and_a_watcher_may_leave(daemon: Daemon) -> None:
    pid, stream = terminal(daemon, "cat")
    first = daemon.stream(CONNECT, {"process": {"pid": pid}})
    second = daemon.stream(CONNECT, {"process": {"pid": pid}})
    assert next(first)["event"]["start"]["pid"] == next(second)["event"]["start"]["pid"] == pid
    stream.close()  # the creator leaves: the terminal runs on
    send(daemon, pid, b"both\n")
    read_until(first, b"both\r\nboth\r\n")
    read_until(second, b"both\r\nboth\r\n")
    send(daemon, pid, b"\x04")
    assert end_of(first)["exited"] and end_of(second)["exited"]


def test_kill_reaches_every_job_of_the_session(daemon: Daemon) -> None:
    # A job that moved to a process group of its own (as an interactive shell's jobs do)
    # is still in the terminal's session: the kill reaches it too.
    code = "import os, time; os.setpgid(0, 0); print('job', os.getpid(), flush=True)"
    code += "; time.sleep(600)"
    pid, stream = terminal(daemon, "/bin/sh", "-c", f"{sys.executable} -c {code!r} & wait")
    job = int(read_until(stream, b"\n").split(b"job ")[1].split()[0])
    assert _process_group(job) != pid
    kill(daemon, pid)
    assert end_of(stream)["status"] == "signal: killed"
    wait_for(lambda: _gone(job))


def test_terminal_input_and_stdin_do_not_mix(daemon: Daemon) -> None:
    pid, stream = terminal(daemon, "cat")
    refused = send(daemon, pid, b"x", field="stdin")
    assert (refused.status_code, refused.json()["code"]) == (400, "failed_precondition")
    closed = daemon.unary("process.Process/CloseStdin", {"process": {"pid": pid}})
    assert closed.json()["code"] == "failed_precondition"
    both = {"process": {"pid": pid}, "input": {"pty": b64(b"a"), "stdin": b64(b"b")}}
    assert daemon.unary("process.Process/SendInput", both).json()["code"] == "invalid_argument"
    plain = daemon.stream(START, {"process": {"cmd": "cat"}, "stdin": True})
    plain_pid = next(plain)["event"]["start"]["pid"]
    assert send(daemon, plain_pid, b"x").json()["code"] == "failed_precondition"
    assert resize(daemon, plain_pid, 10, 10).json()["code"] == "failed_precondition"
    for one in (pid, plain_pid):
        kill(daemon, one)
    end_of(stream), end_of(plain)


def test_bad_sizes_are_invalid_argument(daemon: Daemon) -> None:
    for size in ({}, {"rows": 0, "cols": 80}, {"rows": 24, "cols": 70000}, {"rows": "x"}):
        events = list(daemon.stream(START, {"process": {"cmd": "cat"}, "pty": {"size": size}}))
        assert events[-1]["_end"]["error"]["code"] == "invalid_argument", size
    pid, stream = terminal(daemon, "cat")
    assert resize(daemon, pid, 0, 0).json()["code"] == "invalid_argument"
    kill(daemon, pid)
    end_of(stream)


def test_the_number_of_terminals_is_bounded(daemon: Daemon) -> None:
    opened = [terminal(daemon, "cat") for _ in range(_pty.LIMIT)]
    try:
        events = list(daemon.stream(START, {"process": {"cmd": "cat"}, "pty": PTY}))
        assert events[-1]["_end"]["error"]["code"] == "resource_exhausted"
    finally:
        for pid, stream in opened:
            kill(daemon, pid)
            end_of(stream)
    # Ended terminals give their places back.
    pid, stream = terminal(daemon, "cat")
    kill(daemon, pid)
    end_of(stream)


def test_a_terminal_that_reads_nothing_does_not_hang_the_writer(daemon: Daemon) -> None:
    # Raw mode: the line discipline keeps every byte (a cooked line past 4 KiB drops them).
    pid, stream = terminal(daemon, "/bin/sh", "-c", "stty raw -echo; echo ready; exec sleep 600")
    read_until(stream, b"ready")
    stream.close()
    refused = None
    for _ in range(64):  # the kernel queues some 70 KiB of input: it fills within these
        answer = send(daemon, pid, b"x" * 4096)
        if answer.status_code != 200:
            refused = answer
            break
    assert refused is not None and refused.json()["code"] == "unavailable"
    kill(daemon, pid)


def kill(daemon: Daemon, pid: int) -> None:
    body = {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
    assert daemon.unary("process.Process/SendSignal", body).status_code == 200


def _process_group(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[2])


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True
