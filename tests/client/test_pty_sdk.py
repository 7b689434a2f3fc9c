"""``sbx.pty`` in the native SDK (async and blocking) against a real server, and against the
answers a hostile or broken sandbox could send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from ringfence.client import (
    AsyncPtyHandle,
    AsyncSandbox,
    ProcessNotFound,
    Sandbox,
)
from ringfence.client._pty import AsyncPty
from ringfence.errors import InvalidRequest, SandboxError
from tests.client.conftest import FROM_SANDBOX, LiveServer, frame, mock_link

WAIT = 30  # a bound, never an expectation: every wait here ends on an event


@pytest.fixture
async def sbx(live: LiveServer) -> AsyncIterator[AsyncSandbox]:
    async with await AsyncSandbox.create(url=live.url, api_key=live.key) as sandbox:
        yield sandbox


async def read_until(term: AsyncPtyHandle, needle: bytes) -> bytes:
    seen = b""
    async with asyncio.timeout(WAIT):
        async for chunk in term:
            seen += chunk
            if needle in seen:
                return seen
    raise AssertionError(f"the terminal ended before {needle!r}: {seen!r}")


async def test_a_terminal_streams_takes_input_resizes_and_ends_with_its_exit_code(
    sbx: AsyncSandbox,
) -> None:
    term = await sbx.pty.create(rows=24, cols=80, cwd="/tmp", envs={"MINE": "native"})
    await term.send_input('echo "=$((6*7))= $(id -u) $(pwd) $MINE $TERM =$((7*8))="\n')
    seen = await read_until(term, b"=56=")
    assert b"=42= 1000 /tmp native xterm-256color =56=" in seen
    await term.resize(33, 99)
    await term.send_input("stty size\n")
    await read_until(term, b"33 99\r\n")
    await term.send_input("exit 5\n")
    assert await asyncio.wait_for(term.wait(), WAIT) == 5


async def test_on_data_a_second_watcher_and_kill(sbx: AsyncSandbox) -> None:
    got: list[bytes] = []
    seen = asyncio.Event()

    def on_data(chunk: bytes) -> None:
        got.append(chunk)
        if b"both-10" in b"".join(got):
            seen.set()

    term = await sbx.pty.create(cmd=["/bin/sh"], on_data=on_data)
    watcher = await sbx.pty.connect(term.pid)
    await sbx.pty.send_input(term.pid, "echo both-$((5+5))\n")
    await asyncio.wait_for(seen.wait(), WAIT)
    await read_until(watcher, b"both-10")
    assert term.pid in {p.pid for p in await sbx.commands.list()}
    assert await term.kill() is True
    assert await asyncio.wait_for(term.wait(), WAIT) == -1
    assert await asyncio.wait_for(watcher.wait(), WAIT) == -1
    assert await sbx.pty.kill(term.pid) is False
    with pytest.raises(ProcessNotFound):
        await sbx.pty.send_input(term.pid, "x")


async def test_a_terminal_has_the_confinement_of_a_command(sbx: AsyncSandbox) -> None:
    # Same user, cgroup (the sandbox's limits), seccomp filter, no-new-privs, capabilities.
    probe = (
        "id -u; cat /proc/self/cgroup; "
        "grep -E '^(Seccomp|NoNewPrivs|CapEff|CapBnd):' /proc/self/status; echo =$((2*21))="
    )
    command = (await sbx.commands.run(probe)).stdout
    term = await sbx.pty.create(cmd=["/bin/sh", "-c", probe])
    seen = await read_until(term, b"=42=")
    assert seen.decode().replace("\r\n", "\n") == command
    assert "Seccomp:\t2" in command and "NoNewPrivs:\t1" in command
    assert await asyncio.wait_for(term.wait(), WAIT) == 0


async def test_root_terminal_and_bad_requests(sbx: AsyncSandbox) -> None:
    term = await sbx.pty.create(cmd=["/bin/sh", "-c", "id -u; stty size"], user="root")
    assert b"0\r\n24 80" in await read_until(term, b"24 80")
    assert await asyncio.wait_for(term.wait(), WAIT) == 0
    with pytest.raises(InvalidRequest):
        await sbx.pty.create(rows=0)
    with pytest.raises(InvalidRequest):
        await sbx.pty.create(cmd=["/no/such/program"])
    plain = await sbx.commands.run("sleep 60", background=True)
    with pytest.raises(InvalidRequest):  # no terminal to resize or type into
        await sbx.pty.resize(plain.pid, 10, 10)
    await plain.kill()


async def test_a_killed_sandbox_ends_its_terminal_with_an_error(live: LiveServer) -> None:
    sandbox = await AsyncSandbox.create(url=live.url, api_key=live.key)
    term = await sandbox.pty.create()
    await term.send_input("echo up-$((1+1))\n")
    await read_until(term, b"up-2")
    await sandbox.kill()
    with pytest.raises(SandboxError) as raised:  # never an exit code that looks like one
        await asyncio.wait_for(term.wait(), WAIT)
    assert raised.value.code == SandboxError.code


def test_the_blocking_twin(live: LiveServer) -> None:
    with Sandbox.create(url=live.url, api_key=live.key) as sandbox:
        term = sandbox.pty.create(rows=10, cols=40)
        term.send_input("stty size; exit 3\n")
        seen = b""
        for chunk in term:
            seen += chunk
        assert b"10 40" in seen
        assert term.wait() == 3


def _answering(*frames: bytes) -> AsyncPty:
    body = b"".join(frames)
    headers = {**FROM_SANDBOX, "content-type": "application/connect+json"}
    stream = httpx.ByteStream(body)
    return AsyncPty(mock_link(lambda _: httpx.Response(200, headers=headers, stream=stream)))


START = frame({"event": {"start": {"pid": 7}}})


async def test_terminal_output_that_is_not_base64_is_a_sandbox_error() -> None:
    pty = _answering(START, frame({"event": {"data": {"pty": "not base64!"}}}))
    term = await pty.create()
    with pytest.raises(SandboxError):
        await term.wait()


@pytest.mark.parametrize("last", [b"", frame({}, 2)], ids=["cut", "ended-without-end-event"])
async def test_a_stream_cut_short_is_a_sandbox_error_not_an_exit(last: bytes) -> None:
    data = frame({"event": {"data": {"pty": "YWI="}}})
    term = await _answering(START, data, last).create()
    with pytest.raises(SandboxError) as raised:
        await term.wait()
    assert raised.value.code == SandboxError.code


async def test_bad_sizes_and_commands_are_refused_unsent() -> None:
    def refuse(_: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing is sent")

    pty = AsyncPty(mock_link(refuse))
    for rows, cols in ((0, 80), (24, 70000), (True, 80)):
        with pytest.raises(InvalidRequest):
            await pty.create(rows, cols)
    with pytest.raises(InvalidRequest):
        await pty.create(cmd=[])
    with pytest.raises(InvalidRequest):
        await pty.create(cmd="bash")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        await pty.resize(7, 0, 0)
    with pytest.raises(InvalidRequest):
        await pty.create(user="bob")
