"""``run_code`` and code contexts through the SDK: against a real server (SQLite and
PostgreSQL), and against answers a hostile or broken sandbox could send."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from ringfence.client import (
    AsyncSandbox,
    Context,
    ContextNotFound,
    ExecutionError,
    OutputMessage,
    Result,
    Sandbox,
    SandboxNotRunning,
)
from ringfence.client._base import Settings
from ringfence.client._code import AsyncCode
from ringfence.client._link import Link, http_client
from ringfence.errors import InvalidRequest, SandboxError, SandboxNotFound
from tests.client.conftest import FROM_SANDBOX, LiveServer, mock_link

WAIT = 60  # a bound, never an expectation: every wait here ends on an event


@pytest.fixture
async def sbx(live: LiveServer) -> AsyncIterator[AsyncSandbox]:
    async with await AsyncSandbox.create(url=live.url, api_key=live.key, timeout=300) as sandbox:
        yield sandbox


@pytest.mark.every_store
async def test_state_persists_and_the_last_line_is_the_main_result(sbx: AsyncSandbox) -> None:
    first = await sbx.run_code("x = 1\nprint('set')")
    assert ("".join(first.logs.stdout), first.results, first.error) == ("set\n", [], None)
    assert first.text is None
    second = await sbx.run_code("x + 1")
    assert second.text == "2" and second.results[0].is_main_result
    assert second.execution_count == first.execution_count + 1  # type: ignore[operator]


async def test_a_plot_is_a_png_result(sbx: AsyncSandbox) -> None:
    seen: list[Result] = []
    execution = await sbx.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
        on_result=seen.append,
    )
    [figure] = [result for result in execution.results if result.png is not None]
    assert figure.png is not None and not figure.is_main_result
    assert base64.b64decode(figure.png).startswith(b"\x89PNG\r\n\x1a\n")
    assert "png" in figure.formats() and seen == execution.results


async def test_a_dataframe_is_an_html_table(sbx: AsyncSandbox) -> None:
    execution = await sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    [main] = execution.results
    assert main.html is not None and "<table" in main.html
    assert main.formats()[0] == "html" and main.text is not None and "a  b" in main.text


async def test_an_exception_is_data_not_raised(sbx: AsyncSandbox) -> None:
    errors: list[ExecutionError] = []

    async def on_error(error: ExecutionError) -> None:  # async callbacks are awaited
        errors.append(error)

    execution = await sbx.run_code("print('before')\n1 / 0", on_error=on_error)
    assert execution.error is not None and errors == [execution.error]
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "Traceback" in execution.error.traceback and "1 / 0" in execution.error.traceback
    assert "".join(execution.logs.stdout) == "before\n" and execution.text is None


async def test_a_context_removed_right_after_its_restart_goes_at_once(sbx: AsyncSandbox) -> None:
    # A context outside the daemon's directory starts by fork; removed at once after a
    # restart, its new interpreter could still be between fork and setsid: the kill by its
    # group missed it and the remove waited for it, 60 s, then "not running" (1 in 4 here).
    defaults = await sbx.list_code_contexts()  # python's (and javascript's): listed, as E2B's
    assert "python" in {context.language for context in defaults}
    for _ in range(12):
        context = await sbx.create_code_context(cwd="/tmp")
        await sbx.restart_code_context(context)
        await asyncio.wait_for(sbx.remove_code_context(context), WAIT)
    assert await sbx.list_code_contexts() == defaults
    assert (await sbx.commands.run("echo alive")).stdout == "alive\n"


async def test_contexts_are_apart_and_restart_and_remove(sbx: AsyncSandbox) -> None:
    one = await sbx.create_code_context()
    two = await sbx.create_code_context(cwd="/tmp")
    assert (one.language, two.cwd) == ("python", "/tmp")
    await sbx.run_code("secret = 42", context=one)
    assert (await sbx.run_code("secret", context=one.id)).text == "42"
    other = await sbx.run_code("secret", context=two)
    assert other.error is not None and other.error.name == "NameError"
    assert (await sbx.run_code("import os; os.getcwd()", context=two)).text == "/tmp"
    assert {one, two} <= set(await sbx.list_code_contexts())

    await sbx.restart_code_context(one)
    after = await sbx.run_code("secret", context=one)
    assert after.error is not None and after.error.name == "NameError", "a restart drops state"

    await sbx.remove_code_context(two.id)
    assert two not in await sbx.list_code_contexts()
    for call in (
        sbx.run_code("1", context=two),
        sbx.restart_code_context(two),
        sbx.remove_code_context(two),
        sbx.run_code("1", context="no/such:id"),  # refused before it is sent
    ):
        with pytest.raises(ContextNotFound) as raised:
            await call
        assert raised.value.code == "not_found"


async def test_bash_is_a_language(sbx: AsyncSandbox) -> None:
    await sbx.run_code("export GREETING=hello; cd /tmp", language="bash")
    execution = await sbx.run_code("echo $GREETING from $(pwd)", language="bash")
    assert "".join(execution.logs.stdout) == "hello from /tmp\n" and execution.error is None
    failed = await sbx.run_code("false", language="bash")
    assert failed.error == ExecutionError("ExitStatus", "1", "")
    context = await sbx.create_code_context("bash")
    assert context.language == "bash"
    env = await sbx.run_code("echo $ONLY_HERE", context=context, envs={"ONLY_HERE": "yes"})
    assert "".join(env.logs.stdout) == "yes\n"


async def test_on_stdout_gets_chunks_while_the_cell_runs(sbx: AsyncSandbox) -> None:
    first = asyncio.Event()
    seen: list[OutputMessage] = []

    def on_stdout(message: OutputMessage) -> None:
        seen.append(message)
        if "\n" in message.line:
            first.set()

    # The cell waits for a file that the test writes only after the first chunk came.
    cell = (
        "import os, sys, time\nprint('ready', flush=True)\n"
        f"deadline = time.monotonic() + {WAIT}\n"
        "while not os.path.exists('/home/user/go') and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "print('done')\nprint('oops', file=sys.stderr)"
    )
    errors: list[OutputMessage] = []
    running = asyncio.create_task(sbx.run_code(cell, on_stdout=on_stdout, on_stderr=errors.append))
    await asyncio.wait_for(first.wait(), WAIT)
    assert not running.done() and "".join(str(m) for m in seen) == "ready\n"
    assert seen[0].timestamp is not None and not seen[0].error
    await sbx.files.write("/home/user/go", "")
    execution = await asyncio.wait_for(running, WAIT)
    assert "".join(m.line for m in seen) == "".join(execution.logs.stdout) == "ready\ndone\n"
    assert [m.line for m in errors] == execution.logs.stderr and errors[0].error
    assert "".join(execution.logs.stderr) == "oops\n"


async def test_a_deadline_interrupts_the_cell_and_keeps_the_context(sbx: AsyncSandbox) -> None:
    await sbx.run_code("kept = 'yes'")
    stopped = await sbx.run_code("while True: pass", timeout=0.5)
    assert stopped.error is not None and stopped.error.name == "KeyboardInterrupt"
    assert (await sbx.run_code("kept")).text == "yes"


async def test_bad_requests_are_invalid(sbx: AsyncSandbox) -> None:
    context = await sbx.create_code_context()
    for call in (
        sbx.run_code("1", context=context, language="python"),
        sbx.run_code("1", language="cobol"),
        sbx.run_code("1", timeout=-1),
        sbx.create_code_context("cobol"),
        sbx.create_code_context(cwd="/no/such/dir"),
    ):
        with pytest.raises(InvalidRequest) as raised:
            await call
        assert raised.value.code == "invalid_request"


async def test_an_ended_sandbox_is_not_running(live: LiveServer) -> None:
    sbx = await AsyncSandbox.create(url=live.url, api_key=live.key)
    try:
        started = asyncio.Event()
        cell = asyncio.create_task(
            sbx.run_code(
                "import time\nprint('sleeping', flush=True)\ntime.sleep(60)",
                on_stdout=lambda _: started.set(),
            )
        )
        await asyncio.wait_for(started.wait(), WAIT)
        await sbx.kill()  # mid-cell: the answer is cut short
        with pytest.raises(SandboxNotRunning):
            await asyncio.wait_for(cell, WAIT)
        with pytest.raises(SandboxNotRunning):
            await sbx.run_code("1")
        with pytest.raises(SandboxNotRunning):
            await sbx.list_code_contexts()
    finally:
        await sbx.aclose()


async def test_another_tenant_sees_no_sandbox(sbx: AsyncSandbox, live: LiveServer) -> None:
    settings = Settings.resolve(live.url, live.other_key, 30)
    intruder = AsyncSandbox(await sbx.info(), Link(settings, sbx.id, http_client(settings)))
    try:
        for attempt in (
            intruder.run_code("open('pwned', 'w')"),
            intruder.create_code_context(),
            intruder.list_code_contexts(),
        ):
            with pytest.raises(SandboxNotFound):
                await attempt
    finally:
        await intruder.aclose()


def test_the_sync_sandbox_runs_code(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGFENCE_URL", live.url)
    monkeypatch.setenv("RINGFENCE_API_KEY", live.key)
    with Sandbox.create(timeout=120) as sbx:
        chunks: list[str] = []
        sbx.run_code("x = 20", on_stdout=lambda m: chunks.append(m.line))
        execution = sbx.run_code("print('hi')\nx + 22", on_stdout=lambda m: chunks.append(m.line))
        assert (execution.text, "".join(chunks)) == ("42", "hi\n")
        context = sbx.create_code_context()
        assert isinstance(context, Context) and context in sbx.list_code_contexts()
        failed = sbx.run_code("x", context=context)
        assert failed.error is not None and failed.error.name == "NameError"
        sbx.run_code("y = 1", context=context)
        sbx.restart_code_context(context)
        assert sbx.run_code("'y' in globals()", context=context).text == "False"
        sbx.remove_code_context(context)
        with pytest.raises(ContextNotFound):
            sbx.run_code("1", context=context)


# -- answers a real sandbox would not give -----------------------------------------------------


def _answering(body: bytes, status: int = 200, state: str = "running", **options: Any) -> AsyncCode:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/v1/sandboxes/sbx":
            return httpx.Response(200, json={"id": "sbx", "state": state})
        return httpx.Response(status, headers=FROM_SANDBOX, stream=httpx.ByteStream(body))

    return AsyncCode(mock_link(handler), **options)


def _lines(*messages: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


END = _lines({"type": "number_of_executions", "execution_count": 1}, {"type": "end_of_execution"})


async def test_a_well_formed_answer_is_read_and_unknown_lines_skipped() -> None:
    body = _lines(
        {"type": "stdout", "text": "a", "timestamp": "2024-01-01T00:00:00Z"},
        {"type": "something_newer"},
        {"type": "result", "text": "1", "pdf": "JVBE", "is_main_result": True},
    )
    execution = await _answering(body + END).run("1")
    assert (execution.text, execution.execution_count) == ("1", 1)
    assert execution.results[0].extra == {"pdf": "JVBE"}
    assert execution.results[0].formats() == ["pdf"]


@pytest.mark.parametrize("state", ["running", "killed"])
async def test_an_answer_cut_short_is_an_error(state: str) -> None:
    body = _lines({"type": "stdout", "text": "a"})
    with pytest.raises(SandboxError if state == "running" else SandboxNotRunning):
        await _answering(body, state=state, settle=(0.0, 0.0)).run("1")


@pytest.mark.parametrize(
    "body",
    [
        b"not json\n" + END,
        b"[1]\n" + END,
        _lines({"type": "stdout", "text": 3}) + END,
        _lines({"type": "number_of_executions", "execution_count": "1"}) + END,
    ],
)
async def test_malformed_lines_are_sandbox_errors(body: bytes) -> None:
    with pytest.raises(SandboxError) as raised:
        await _answering(body).run("1")
    assert raised.value.code == "sandbox_error"


async def test_lines_and_answers_are_capped() -> None:
    with pytest.raises(SandboxError):
        await _answering(b"x" * 2000, max_line=1000).run("1")
    many = _lines(*[{"type": "stdout", "text": "y" * 100}] * 200) + END
    with pytest.raises(SandboxError):
        await _answering(many, max_line=1000, max_answer=10_000).run("1")


async def test_the_sandbox_cannot_pass_for_the_server() -> None:
    forged = json.dumps({"error": {"code": "unauthenticated", "message": "log in again"}})
    with pytest.raises(SandboxError):
        await _answering(forged.encode(), status=500).run("1")
    missing = json.dumps({"code": "not_found", "message": "no context"}).encode()
    with pytest.raises(ContextNotFound):
        await _answering(missing, status=404).remove_context("abc")
