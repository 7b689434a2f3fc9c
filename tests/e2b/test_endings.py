"""How a stream that does not finish ends, through the unmodified SDKs: a command past its
``timeout`` raises ``TimeoutException`` (sync and async, foreground and background), and a
sandbox killed mid-``run_code`` or mid-command raises what E2B's SDK raises then, never an
empty result that looks like code that ran and printed nothing."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from e2b_code_interpreter import Sandbox as CodeSandbox

from e2b import AsyncSandbox, Sandbox, SandboxNotRunningException, TimeoutException
from tests.e2b.conftest import E2bServer


def test_a_command_past_its_timeout_raises_timeout(e2b_server: E2bServer) -> None:
    with Sandbox.create(timeout=120) as sbx:
        started = time.monotonic()
        with pytest.raises(TimeoutException):
            sbx.commands.run("sleep 30", timeout=1)
        handle = sbx.commands.run("sleep 30", background=True, timeout=1)
        with pytest.raises(TimeoutException):
            handle.wait()
        assert time.monotonic() - started < 20
        # The stream's end is the deadline's; the kill of the process group it asks for lands
        # just after it (fresh-ci saw a `ps` run in between): wait for it, bounded.
        deadline = time.monotonic() + 10
        while "sleep 30" in (listed := sbx.commands.run("ps -eo args").stdout):
            assert time.monotonic() < deadline, f"not killed: {listed}"
            time.sleep(0.1)


async def test_an_async_command_past_its_timeout_raises_timeout(e2b_server: E2bServer) -> None:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        with pytest.raises(TimeoutException):
            await sbx.commands.run("sleep 30", timeout=1)
        handle = await sbx.commands.run("sleep 30", background=True, timeout=1)
        with pytest.raises(TimeoutException):
            await handle.wait()
        assert (await sbx.commands.run("echo still here")).stdout == "still here\n"
    finally:
        await sbx.kill()


def _killed_while(start: threading.Event, sbx: Sandbox | CodeSandbox, call: Future) -> None:
    assert start.wait(30), "the code never started"
    assert Sandbox.kill(sbx.sandbox_id)
    call.exception(60)  # it ends, one way or the other


def test_a_sandbox_killed_during_run_code_raises(e2b_server: E2bServer) -> None:
    sbx = CodeSandbox.create(timeout=120)
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(
            sbx.run_code,
            "import time\nprint('running', flush=True)\ntime.sleep(60)",
            on_stdout=lambda _: started.set(),
        )
        _killed_while(started, sbx, call)
    with pytest.raises(TimeoutException, match="sandbox was killed"):
        call.result()


def test_a_sandbox_killed_during_a_command_raises_not_running(e2b_server: E2bServer) -> None:
    sbx = Sandbox.create(timeout=120)
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(
            sbx.commands.run, "echo running; sleep 60", on_stdout=lambda _: started.set()
        )
        _killed_while(started, sbx, call)
    with pytest.raises(SandboxNotRunningException):
        call.result()
