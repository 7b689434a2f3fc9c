"""``AsyncSandbox`` against a real server: lifecycle, commands, tenants."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ringfence.client import (
    AsyncSandbox,
    CommandExitError,
    CommandTimeout,
    OutputChunk,
    ProcessNotFound,
    SandboxNotFound,
    SandboxNotRunning,
)
from ringfence.client._base import Settings
from ringfence.client._link import Link, http_client
from ringfence.errors import InvalidRequest
from ringfence.models import SandboxState
from tests.client.conftest import LiveServer

WAIT = 30  # a bound, never a expectation: every wait here ends on an event


@pytest.fixture
async def sbx(live: LiveServer) -> AsyncIterator[AsyncSandbox]:
    async with await AsyncSandbox.create(
        url=live.url, api_key=live.key, metadata={"suite": "client"}
    ) as sandbox:
        yield sandbox


async def test_run_returns_output_and_exit_code(sbx: AsyncSandbox) -> None:
    result = await sbx.commands.run("echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    with pytest.raises(CommandExitError) as exc:
        result.check()
    assert exc.value.code == "command_exit" and exc.value.exit_code == 3
    ok = await sbx.commands.run(["printf", "%s|", "a b", "$HOME"])  # argv: no shell
    assert ok.check().stdout == "a b|$HOME|"


async def test_env_and_cwd(live: LiveServer) -> None:
    async with await AsyncSandbox.create(url=live.url, api_key=live.key, env={"A": "1"}) as sbx:
        result = await sbx.commands.run('echo "$A $B $(pwd)"', envs={"B": "2"}, cwd="/tmp")
        assert result.stdout == "1 2 /tmp\n"
        assert (await sbx.commands.run("pwd")).stdout == "/home/user\n"
        with pytest.raises(InvalidRequest):
            await sbx.commands.run("true", cwd="/no/such/dir")
        assert (await sbx.commands.run("id -un", user="root")).stdout == "root\n"
        assert (await sbx.commands.run("id -un", user="user")).stdout == "user\n"
        with pytest.raises(InvalidRequest):
            await sbx.commands.run("true", user="bob")


async def test_callbacks_get_output_while_the_command_runs(sbx: AsyncSandbox) -> None:
    first = asyncio.Event()
    seen: list[str] = []

    def on_stdout(text: str) -> None:
        seen.append(text)
        first.set()

    # The command waits for a file that the test writes only after the first chunk came.
    script = "echo ready; while [ ! -e go ]; do sleep 0.02; done; echo done"
    running = asyncio.create_task(sbx.commands.run(script, on_stdout=on_stdout))
    await asyncio.wait_for(first.wait(), WAIT)
    assert not running.done() and "".join(seen) == "ready\n"
    await sbx.files.write("go", "")
    result = await asyncio.wait_for(running, WAIT)
    assert "".join(seen) == result.stdout == "ready\ndone\n"


async def test_a_deadline_kills_the_command(sbx: AsyncSandbox) -> None:
    with pytest.raises(CommandTimeout) as exc:
        await sbx.commands.run("echo started; sleep 60", timeout=0.5)
    assert exc.value.code == "command_timeout"
    assert exc.value.result.stdout == "started\n" and exc.value.exit_code == -1
    assert await sbx.commands.list() == []


async def test_background_stdin_iterate_and_wait(sbx: AsyncSandbox) -> None:
    handle = await sbx.commands.run(
        "echo ready; sed 's/^/got /'; exit 4", background=True, stdin=True
    )
    assert [p.pid for p in await sbx.commands.list()] == [handle.pid]
    chunk = await asyncio.wait_for(handle.__anext__(), WAIT)
    assert chunk == OutputChunk("stdout", "ready\n")
    await handle.send_stdin("hello\n")
    await handle.close_stdin()
    chunks = [c async for c in handle]
    assert "".join(c.text for c in chunks) == "got hello\n"
    result = await handle.wait()
    assert (result.stdout, result.exit_code) == ("ready\ngot hello\n", 4)


async def test_kill_and_connect(sbx: AsyncSandbox) -> None:
    handle = await sbx.commands.run("sleep 60", background=True, timeout=None)
    again = await sbx.commands.connect(handle.pid)
    assert await sbx.commands.kill(handle.pid) is True
    for h in (handle, again):
        result = await asyncio.wait_for(h.wait(), WAIT)
        assert (result.exit_code, result.error) == (-1, "signal: killed")
    assert await sbx.commands.kill(handle.pid) is False
    with pytest.raises(ProcessNotFound) as exc:
        await sbx.commands.connect(handle.pid)
    assert exc.value.code == "not_found"
    with pytest.raises(ProcessNotFound):
        await sbx.commands.send_stdin(handle.pid, b"x")


@pytest.mark.every_store
async def test_lifecycle_list_set_timeout_kill(live: LiveServer) -> None:
    tag = {"suite": "lifecycle", "n": "1"}
    sbx = await AsyncSandbox.create(url=live.url, api_key=live.key, metadata=tag, timeout=60)
    try:
        listed = await AsyncSandbox.list(metadata=tag, url=live.url, api_key=live.key)
        assert [s.id for s in listed] == [sbx.id]
        assert (
            await AsyncSandbox.list(
                metadata={"suite": "lifecycle", "n": "2"}, url=live.url, api_key=live.key
            )
            == []
        )
        before = (await sbx.info()).expires_at
        after = (await sbx.set_timeout(600)).expires_at
        assert before is not None and after is not None and after > before
        same = await AsyncSandbox.connect(sbx.id, url=live.url, api_key=live.key)
        assert await same.is_running()
        await same.aclose()
        final = await sbx.kill()
        assert final.state is SandboxState.KILLED
        assert not await sbx.is_running()
        assert (await sbx.kill()).state is SandboxState.KILLED  # idempotent
        killed = await AsyncSandbox.list(
            state="killed", metadata=tag, url=live.url, api_key=live.key
        )
        assert [s.id for s in killed] == [sbx.id]
        with pytest.raises(SandboxNotRunning):
            await AsyncSandbox.connect(sbx.id, url=live.url, api_key=live.key)
        with pytest.raises((SandboxNotFound, SandboxNotRunning)):
            await sbx.commands.run("true")
    finally:
        await sbx.aclose()


@pytest.mark.every_store
async def test_another_tenant_sees_nothing_and_touches_nothing(
    sbx: AsyncSandbox, live: LiveServer
) -> None:
    with pytest.raises(SandboxNotFound):
        await AsyncSandbox.connect(sbx.id, url=live.url, api_key=live.other_key)
    others = await AsyncSandbox.list(url=live.url, api_key=live.other_key)
    assert sbx.id not in [s.id for s in others]
    settings = Settings.resolve(live.url, live.other_key, 30)
    intruder = AsyncSandbox(await sbx.info(), Link(settings, sbx.id, http_client(settings)))
    try:
        for attempt in (
            intruder.commands.run("touch pwned"),
            intruder.files.write("pwned", "x"),
            intruder.files.read(".bashrc"),
            intruder.set_timeout(1),
            intruder.kill(),
        ):
            with pytest.raises(SandboxNotFound) as exc:
                await attempt
            assert exc.value.code == "not_found"
    finally:
        await intruder.aclose()
    assert await sbx.is_running() and not await sbx.files.exists("pwned")


async def test_unknown_sandbox_and_bad_input(live: LiveServer) -> None:
    with pytest.raises(SandboxNotFound):
        await AsyncSandbox.connect("sb-missing", url=live.url, api_key=live.key)
    with pytest.raises(InvalidRequest):
        await AsyncSandbox.create(url=live.url, api_key=live.key, timeout=-1)
    with pytest.raises(InvalidRequest):
        await AsyncSandbox.create(url=live.url, api_key=live.key, limits={"memory": "lots"})
    with pytest.raises(InvalidRequest):
        await AsyncSandbox.list(state="sleeping", url=live.url, api_key=live.key)
