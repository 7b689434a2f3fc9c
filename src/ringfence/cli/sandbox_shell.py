"""``ringfence sandbox shell ID``: an interactive terminal in a sandbox, from a real one.

The local terminal goes to raw mode (every key, ctrl-C included, is the sandbox's), keys
are forwarded as typed, the sandbox terminal's output is written as it comes, and a resize
of the local window (``SIGWINCH``) resizes the sandbox's. The command exits with the
shell's exit code (125 when Ringfence failed: the sandbox ended under it, say; 128 + the
signal for ``SIGTERM`` or ``SIGHUP``, which kill the shell too), and the local terminal is
restored on every way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any

import click

from ringfence.cli._common import fail
from ringfence.cli.sandbox import EXIT_FAILED, _pairs, api_options, client_errors

if TYPE_CHECKING:
    from ringfence.client import AsyncPtyHandle

__all__ = ["shell"]

_READ = 64 * 1024
_BATCH = 256 * 1024  # most bytes of input in one request (a paste goes in several)


@click.command("shell")
@click.argument("sandbox_id")
@click.option("--cwd", help="Working directory [default: /home/user].")
@click.option("--env", "env_items", multiple=True, metavar="K=V", help="Set a variable.")
@click.option("--user", help="user (the default) or root.")
@api_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def shell(
    sandbox_id: str,
    cwd: str | None,
    env_items: tuple[str, ...],
    user: str | None,
    url: str | None,
    api_key: str | None,
    command: tuple[str, ...],
) -> None:
    """Open an interactive terminal in a sandbox: its login shell, or COMMAND (an argv;
    put it after --). Needs a terminal on stdin and stdout.

    Exits with the shell's status; 125 when Ringfence failed (the sandbox ended, say).

    \b
    Example:
      ringfence sandbox shell sb123
      ringfence sandbox shell sb123 -- python3
    """
    env = _pairs(env_items, "--env")
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    if not (os.isatty(stdin) and os.isatty(stdout)):
        fail(
            "sandbox shell needs a terminal on stdin and stdout; "
            "use 'ringfence sandbox exec ID -- COMMAND' without one",
            2,
        )
    ended_by: list[int] = []
    with client_errors(EXIT_FAILED):
        try:
            code = asyncio.run(
                _session(sandbox_id, url, api_key, list(command) or None, cwd, env, user, ended_by)
            )
        except asyncio.CancelledError:
            signum = ended_by[0] if ended_by else signal.SIGTERM
            fail(f"ended by {signal.Signals(signum).name}; the shell was killed", 128 + signum)
    sys.exit(code if 0 <= code <= 255 else EXIT_FAILED)


async def _session(
    sandbox_id: str,
    url: str | None,
    api_key: str | None,
    cmd: list[str] | None,
    cwd: str | None,
    env: dict[str, str],
    user: str | None,
    ended_by: list[int],
) -> int:
    """Run the terminal until it ends; its exit code. A signal that ends the session is
    appended to ``ended_by`` (and the terminal in the sandbox killed).

    Raises:
        asyncio.CancelledError: SIGTERM or SIGHUP ended it. RingfenceError.
    """
    from ringfence.client import AsyncSandbox

    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    sbx = await AsyncSandbox.connect(sandbox_id, url=url, api_key=api_key)
    try:
        rows, cols = _size(stdout)
        term = await sbx.pty.create(
            rows, cols, cmd=cmd, cwd=cwd, envs=env, user=user,
            on_data=lambda chunk: _write_all(stdout, chunk),
        )  # fmt: skip
        ended = asyncio.ensure_future(term.wait())
        try:
            with _raw(stdin, stdout), _forwarding(term, stdin, stdout, ended_by) as failed:
                either: set[asyncio.Future[Any]] = {ended, failed}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if not ended.done():
                    failed.result()  # the error that stopped the forwarding
                return await ended
        except BaseException:
            if not ended.done():
                ended.cancel()
                with contextlib.suppress(Exception):
                    await term.kill()
            raise
    finally:
        await sbx.aclose()


@contextlib.contextmanager
def _forwarding(
    term: AsyncPtyHandle, stdin: int, stdout: int, ended_by: list[int]
) -> Iterator[asyncio.Future[None]]:
    """Keys from ``stdin`` to the terminal, and the window's size on ``SIGWINCH``, while
    the block runs; a future that fails when forwarding fails. ``SIGTERM``/``SIGHUP`` end
    the block by cancelling the task (so the caller's ``finally`` restores the terminal)."""
    loop = asyncio.get_running_loop()
    keys: asyncio.Queue[bytes] = asyncio.Queue()
    failed: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(stdin, _READ)
        except OSError:
            data = b""
        if not data:  # the local terminal is gone: stop reading it
            loop.remove_reader(stdin)
            return
        keys.put_nowait(data)

    async def send() -> None:
        while True:
            data = await keys.get()
            while not keys.empty() and len(data) < _BATCH:  # typed meanwhile: one request
                data += keys.get_nowait()
            await term.send_input(data)

    async def resize() -> None:
        await term.resize(*_size(stdout))

    def report(task: asyncio.Future[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None and not failed.done():
            failed.set_exception(error)

    tasks: set[asyncio.Future[None]] = set()

    def start(coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        task.add_done_callback(report)

    current = asyncio.current_task()

    def end(signum: int) -> None:
        ended_by.append(signum)
        if current is not None:
            current.cancel()

    loop.add_reader(stdin, readable)
    loop.add_signal_handler(signal.SIGWINCH, lambda: start(resize()))
    for ending in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(ending, end, ending)
    start(send())
    try:
        yield failed
    finally:
        loop.remove_reader(stdin)
        for one in (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(one)
        for task in list(tasks):
            task.cancel()


# Modes a program in the sandbox may have turned on in the local terminal and not off (it
# was killed, or the session ended under it): mouse reporting (all its encodings), focus
# events, bracketed paste, the alternate screen, application cursor keys and keypad, a
# hidden cursor, attributes. Turned off on every way out, as ssh clients and tmux do.
TERMINAL_RESET = (
    b"\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1005l\x1b[?1006l\x1b[?1015l"  # mouse
    b"\x1b[?1004l\x1b[?2004l"  # focus events, bracketed paste
    b"\x1b[?1049l\x1b[?1l\x1b>"  # alternate screen, cursor keys, keypad
    b"\x1b[?25h\x1b[0m"  # the cursor shown, attributes reset
)


@contextlib.contextmanager
def _raw(fd: int, out: int) -> Iterator[None]:
    """The terminal ``fd`` in raw mode for the block; after it, however it ends, the modes
    of ``TERMINAL_RESET`` turned off on ``out`` and ``fd``'s settings restored."""
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSANOW)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # a terminal gone: nothing left to reset
            _write_all(out, TERMINAL_RESET)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _size(fd: int) -> tuple[int, int]:
    """``(rows, cols)`` of the local terminal (24 x 80 when it tells none)."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return (size.lines or 24), (size.columns or 80)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
