"""``sbx.pty`` through the unmodified E2B SDK (sync and async): a terminal in the sandbox,
its input, its size, a second watcher, its kill, and what a killed sandbox does to it; the
attacks a terminal's input could try."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from e2b import (
    AsyncSandbox,
    CommandExitException,
    CommandHandle,
    PtySize,
    Sandbox,
    SandboxNotRunningException,
)
from tests.e2b.conftest import E2bServer


@pytest.fixture(scope="module")
def sbx(e2b_server: E2bServer) -> Iterator[Sandbox]:
    with Sandbox.create(timeout=600) as sandbox:
        yield sandbox


def read_until(handle: CommandHandle, needle: bytes, seen: bytearray | None = None) -> bytes:
    """The terminal's output up to ``needle`` (the handle's own timeout bounds the wait)."""
    seen = bytearray() if seen is None else seen
    for _stdout, _stderr, pty in handle:
        if pty is not None:
            seen += pty
            if needle in seen:
                return bytes(seen)
    raise AssertionError(f"the terminal ended before {needle!r}: {bytes(seen)!r}")


def test_a_pty_is_an_interactive_login_shell_of_the_sandbox_user(sbx: Sandbox) -> None:
    handle = sbx.pty.create(PtySize(rows=24, cols=80), cwd="/tmp", envs={"MINE": "yes"})
    # The answer is told from the echoed command line by a marker only the shell computes.
    sbx.pty.send_stdin(handle.pid, b'echo "=$((6*7))= $(id -u) $(pwd) $MINE $TERM $- =$((7*8))="\n')
    seen = read_until(handle, b"=56=")
    found = re.search(rb"=42= (\S+) (\S+) (\S+) (\S+) (\S+) =56=", seen)
    assert found, "the shell answered"
    uid, cwd, mine, term, flags = (part.decode() for part in found.groups())
    assert (uid, cwd, mine, term) == ("1000", "/tmp", "yes", "xterm-256color")
    assert "i" in flags, "bash runs interactive"
    sbx.pty.send_stdin(handle.pid, b"stty size\n")
    read_until(handle, b"24 80\r\n")
    sbx.pty.resize(handle.pid, PtySize(rows=40, cols=132))
    sbx.pty.send_stdin(handle.pid, b"stty size; tput cols\n")
    read_until(handle, b"40 132\r\n132")
    sbx.pty.send_stdin(handle.pid, b"exit 3\n")
    with pytest.raises(CommandExitException) as caught:
        handle.wait()
    assert caught.value.exit_code == 3


def test_vim_draws_full_screen_follows_a_resize_and_saves(sbx: Sandbox) -> None:
    handle = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(handle.pid, b"vim -u NONE -N /tmp/vim.txt\n")
    read_until(handle, b"\x1b[?1049h")  # vim's alternate screen: it drew full screen
    sbx.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    seen = bytearray()
    sbx.pty.send_stdin(handle.pid, b":echo 'size' &lines &columns\r")
    read_until(handle, b"size 30 100", seen)
    sbx.pty.send_stdin(handle.pid, b"ihello from vim\x1b:wq\r")
    read_until(handle, b"\x1b[?1049l", seen)  # back from the alternate screen
    assert sbx.files.read("/tmp/vim.txt") == "hello from vim\n"
    sbx.pty.kill(handle.pid)


def test_connect_adds_a_watcher_and_kill_ends_both(sbx: Sandbox) -> None:
    handle = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    sbx.pty.send_stdin(handle.pid, b"echo first-$((40+2))\n")
    read_until(handle, b"first-42")
    other = sbx.pty.connect(handle.pid)
    sbx.pty.send_stdin(handle.pid, b"echo second-$((40+3))\n")
    read_until(handle, b"second-43")
    read_until(other, b"second-43")
    assert handle.pid in {p.pid for p in sbx.commands.list()}
    assert sbx.pty.kill(handle.pid) is True
    for one in (handle, other):
        with pytest.raises(CommandExitException):
            one.wait()
    assert sbx.pty.kill(handle.pid) is False, "an ended terminal is not found"


def test_ctrl_c_interrupts_the_foreground_job_and_the_shell_runs_on(sbx: Sandbox) -> None:
    handle = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(handle.pid, b"sleep 600; echo after-$((1+1))\n")
    read_until(handle, b"sleep 600")
    sbx.pty.send_stdin(handle.pid, b"\x03")
    sbx.pty.send_stdin(handle.pid, b"echo alive-$((2+3))\n")
    seen = read_until(handle, b"alive-5")
    assert b"after-2" not in seen, "ctrl-C ended the whole command line"
    sbx.pty.kill(handle.pid)


def test_stream_input_types_into_the_terminal(sbx: Sandbox) -> None:
    handle = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.stream_input(handle.pid, iter([b"echo str", b"eamed-$((3*3))\n"]))
    read_until(handle, b"streamed-9")
    sbx.pty.kill(handle.pid)


def test_pty_input_cannot_push_input_or_reach_the_hosts_terminals(sbx: Sandbox) -> None:
    host_master, host_slave = os.openpty()  # the host has terminals the sandbox must not see
    try:
        handle = sbx.pty.create(PtySize(rows=24, cols=80))
        # TIOCSTI (push bytes into a terminal's input queue) is refused by seccomp; the
        # sandbox's devpts is its own: its terminals only, never the host's.
        probe = (
            'python3 -c "import fcntl, termios\n'
            "try: fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('pushed')\n"
            "except OSError as e: print('refused', e.errno)\"; "
            "echo \"=$((5*5))= $(ls /dev/pts | sort | tr '\\n' ' ')=$((6*6))=\"\n"
        )
        sbx.pty.send_stdin(handle.pid, probe.encode())
        seen = read_until(handle, b"=36=").decode()
        assert "refused 1\r\n" in seen and "pushed\r\n" not in seen
        listed = seen.rsplit("=25= ", 1)[1].split("=36=")[0].split()
        assert "ptmx" in listed and all(x == "ptmx" or x.isdigit() for x in listed)
        assert len(listed) <= 4, f"only the sandbox's own terminals: {listed}"
        # Hostile bytes are only input to the shell (which they may stop, ^S, or end, ^D):
        # control sequences, NULs, a flood; the sandbox and its next terminal are fine.
        junk = bytes(range(256)) * 64 + b"\x1b]0;title\x07\x1b[6n\x00\x1a\x1c"
        sbx.pty.send_stdin(handle.pid, junk)
        assert sbx.commands.run("echo fine").stdout == "fine\n"
        sbx.pty.kill(handle.pid)
        fresh = sbx.pty.create(PtySize(rows=24, cols=80))
        sbx.pty.send_stdin(fresh.pid, b"echo still-$((6*7))\n")
        read_until(fresh, b"still-42")
        sbx.pty.kill(fresh.pid)
    finally:
        os.close(host_master)
        os.close(host_slave)


def test_a_killed_sandbox_ends_its_pty_stream(e2b_server: E2bServer) -> None:
    sandbox = Sandbox.create(timeout=120)
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    sandbox.pty.send_stdin(handle.pid, b"echo up-$((1+1))\n")
    read_until(handle, b"up-2")
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(lambda: (started.set(), handle.wait()))
        assert started.wait(10)  # wait() reading or about to: the kill ends it either way
        assert Sandbox.kill(sandbox.sandbox_id)
        with pytest.raises(SandboxNotRunningException):
            waiting.result(60)


async def test_async_pty_with_on_data(e2b_server: E2bServer) -> None:
    sandbox = await AsyncSandbox.create(timeout=120)
    try:
        seen = bytearray()
        arrived = asyncio.Event()

        def on_data(data: bytes) -> None:
            seen.extend(data)
            if b"async-77" in seen:
                arrived.set()

        handle = await sandbox.pty.create(PtySize(rows=30, cols=100), on_data=on_data)
        await sandbox.pty.send_stdin(handle.pid, b"stty size; echo async-$((7*11))\n")
        async with asyncio.timeout(30):
            await arrived.wait()
        assert b"30 100" in seen
        await sandbox.pty.resize(handle.pid, PtySize(rows=12, cols=34))
        await sandbox.pty.send_stdin(handle.pid, b"stty size; exit\n")
        result = await handle.wait()
        assert result.exit_code == 0 and b"12 34" in seen
    finally:
        await sandbox.kill()


JS_SCENARIO = Path(__file__).parents[1] / "js" / "e2b_pty.mjs"


def test_js_sdk_pty(e2b_server: E2bServer) -> None:
    node = shutil.which("node")
    assert node, "the machine's node is required (scripts/setup installs it)"
    done = subprocess.run(
        [node, str(JS_SCENARIO)],
        cwd=JS_SCENARIO.parent,
        env={**os.environ, "E2B_API_URL": e2b_server.url, "E2B_SANDBOX_URL": e2b_server.url,
             "E2B_API_KEY": e2b_server.key},
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "answer": "1000 /tmp js xterm-256color",
        "resized": True,
        "watched": True,
        "exit": "CommandExitError:4",
        "killed": True,
        "killedAgain": False,
    }
