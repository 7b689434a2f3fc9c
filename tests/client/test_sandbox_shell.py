"""``ringfence sandbox shell ID`` driven from a real pseudo-terminal, as a user's terminal
emulator drives it: raw mode, keys typed, full-screen output, a window resize (SIGWINCH),
the shell's exit code, and the local terminal restored on every way out."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from ringfence.client import Sandbox
from tests.client.conftest import LiveServer
from tests.server.test_serve_process import RINGFENCE

WAIT = 30.0  # a bound on each wait for output, never an expectation


@dataclass
class Terminal:
    """A pseudo-terminal whose slave is the controlling terminal of a CLI process."""

    master: int
    slave: int
    pid: int
    seen: bytearray = field(default_factory=bytearray)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def read_until(self, needle: bytes, timeout: float = WAIT) -> bytes:
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {needle!r} in {bytes(self.seen)!r}"
            if select.select([self.master], [], [], left)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the CLI has exited and closed its terminal
                    chunk = b""
                assert chunk, f"the CLI ended before {needle!r}: {bytes(self.seen)!r}"
                self.seen += chunk
        return bytes(self.seen)

    def resize(self, rows: int, cols: int) -> None:
        """What a terminal emulator does when its window changes: the kernel sends the
        CLI's foreground process group SIGWINCH."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def exit_status(self, timeout: float = WAIT) -> int:
        """The CLI's exit status (draining its output meanwhile: it must not block on it)."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            assert time.monotonic() < deadline, "the CLI did not exit"
            if select.select([self.master], [], [], 0.05)[0]:
                with contextlib.suppress(OSError):  # EIO once it has closed the terminal
                    self.seen += os.read(self.master, 65536)


def retype_until(term: Terminal, keys: bytes, needle: bytes) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        term.type(keys)
        try:
            term.read_until(needle, 2)
            return
        except AssertionError:
            assert time.monotonic() < deadline, bytes(term.seen)


def _spawn(live: LiveServer, *args: str, rows: int = 24, cols: int = 80) -> Terminal:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**os.environ, "RINGFENCE_URL": live.url, "RINGFENCE_API_KEY": live.key}
    argv = [RINGFENCE, "sandbox", "shell", *args]
    pid = os.fork()
    if pid == 0:  # the child: become the session of this terminal, then the CLI
        try:
            os.close(master)
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(slave, fd)
            os.execve(RINGFENCE, argv, env)
        finally:
            os._exit(127)
    return Terminal(master, slave, pid)


@pytest.fixture
def sandbox_id(live: LiveServer) -> Iterator[str]:
    with Sandbox.create(url=live.url, api_key=live.key) as sbx:
        yield sbx.id


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for term in opened:
        try:
            os.kill(term.pid, signal.SIGKILL)
            os.waitpid(term.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(term.master)
        os.close(term.slave)


def test_an_interactive_shell_full_screen_output_a_resize_and_its_exit_code(
    live: LiveServer, sandbox_id: str, terminals: list[Terminal]
) -> None:
    term = _spawn(live, sandbox_id)
    terminals.append(term)
    cooked = termios.tcgetattr(term.slave)
    term.type(b"echo ready-$((40+2))\r")
    term.read_until(b"ready-42")
    raw = termios.tcgetattr(term.slave)
    assert not raw[3] & (termios.ECHO | termios.ICANON | termios.ISIG), "raw mode"
    # Typed keys are the sandbox's: ctrl-C interrupts a command there, not the CLI.
    term.type(b"sleep 600\r")
    term.read_until(b"sleep 600\r\n")
    term.type(b"\x03echo alive-$((2+3))\r")
    term.read_until(b"alive-5")
    # Full-screen output, as vim draws: the alternate screen, cursor moves, the size.
    term.type(b"tput smcup; tput cup 5 10; printf X; tput rmcup; stty size; tput lines\r")
    seen = term.read_until(b"24 80\r\n24")
    assert b"\x1b[?1049h" in seen and b"\x1b[6;11HX" in seen and b"\x1b[?1049l" in seen
    # The window grows: SIGWINCH in the CLI, the sandbox terminal's new size (the resize
    # travels apart from the keys: ask again until it has landed).
    term.resize(50, 132)
    retype_until(term, b"stty size\r", b"50 132\r\n")
    term.type(b"exit 7\r")
    assert term.exit_status() == 7
    assert termios.tcgetattr(term.slave) == cooked, "the terminal is restored"


def test_a_command_instead_of_the_shell(
    live: LiveServer, sandbox_id: str, terminals: list[Terminal]
) -> None:
    term = _spawn(live, sandbox_id, "--cwd", "/tmp", "--env", "A=b", "--", "/bin/sh", "-c",
                  'echo "$A $(pwd) $(tty)"; exit 3', rows=30, cols=100)  # fmt: skip
    terminals.append(term)
    assert term.exit_status() == 3
    assert b"b /tmp /dev/pts/" in term.seen


def test_modes_the_sandbox_turned_on_are_turned_off_in_the_local_terminal(
    live: LiveServer, sandbox_id: str, terminals: list[Terminal]
) -> None:
    """Review 2a #8: mouse reporting, bracketed paste, the alternate screen and a hidden
    cursor stayed on in the local terminal after the shell ended."""
    modes = [(b"\x1b[?1000h", b"\x1b[?1000l"), (b"\x1b[?2004h", b"\x1b[?2004l"),
             (b"\x1b[?1049h", b"\x1b[?1049l"), (b"\x1b[?25l", b"\x1b[?25h")]  # fmt: skip
    script = "printf '" + "".join(on.decode().replace("\x1b", "\\033") for on, _ in modes)
    term = _spawn(live, sandbox_id, "--", "/bin/sh", "-c", script + "'; echo modes-on; exit 0")
    terminals.append(term)
    term.read_until(b"modes-on")
    assert term.exit_status() == 0
    for on, off in modes:
        assert term.seen.rfind(on) >= 0, bytes(term.seen)
        assert term.seen.rfind(off) > term.seen.rfind(on), (off, bytes(term.seen))


def test_a_paste_larger_than_one_request_arrives_whole(
    live: LiveServer, sandbox_id: str, terminals: list[Terminal]
) -> None:
    script = "stty raw -echo; echo ready; head -c 600000 | md5sum; exit 0"
    term = _spawn(live, sandbox_id, "--", "/bin/sh", "-c", script)
    terminals.append(term)
    term.read_until(b"ready")
    pasted = (bytes(range(32, 127)) * 6400)[:600_000]  # printable: raw mode passes them all
    for start in range(0, len(pasted), 4096):  # as a terminal emulator writes a paste
        term.type(pasted[start : start + 4096])
    term.read_until(hashlib.md5(pasted).hexdigest().encode())
    assert term.exit_status() == 0


def test_the_terminal_is_restored_when_the_sandbox_dies_under_it(
    live: LiveServer, terminals: list[Terminal]
) -> None:
    sbx = Sandbox.create(url=live.url, api_key=live.key)
    term = _spawn(live, sbx.id)
    terminals.append(term)
    cooked = termios.tcgetattr(term.slave)
    term.type(b"echo up-$((1+1))\r")
    term.read_until(b"up-2")
    assert sbx.kill()
    sbx.close()
    assert term.exit_status() == 125  # Ringfence failed, not the shell
    assert termios.tcgetattr(term.slave) == cooked
    assert b"ringfence: " in term.seen.split(b"up-2")[-1], "one line says why"


def test_sigterm_kills_the_shell_and_restores_the_terminal(
    live: LiveServer, sandbox_id: str, terminals: list[Terminal]
) -> None:
    term = _spawn(live, sandbox_id)
    terminals.append(term)
    cooked = termios.tcgetattr(term.slave)
    term.type(b"echo up-$((1+1)) $$\r")
    shell = term.read_until(b"up-2 ").split(b"up-2 ")[-1]
    os.kill(term.pid, signal.SIGTERM)
    assert term.exit_status() == 128 + signal.SIGTERM
    assert termios.tcgetattr(term.slave) == cooked
    sbx = Sandbox.connect(sandbox_id, url=live.url, api_key=live.key)
    deadline = time.monotonic() + WAIT
    while any(p.pid == int(shell.split()[0]) for p in sbx.commands.list()):
        assert time.monotonic() < deadline, "the shell in the sandbox was not killed"
        time.sleep(0.05)
    sbx.close()


def test_without_a_terminal_it_is_one_clear_line(live: LiveServer, sandbox_id: str) -> None:
    env = {**os.environ, "RINGFENCE_URL": live.url, "RINGFENCE_API_KEY": live.key}
    done = subprocess.run(
        [RINGFENCE, "sandbox", "shell", sandbox_id], env=env, stdin=subprocess.DEVNULL,
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and "needs a terminal" in lines[0], lines
