"""Code contexts over the HTTP API, in real sandboxes: a stateful interpreter with rich
results, errors as data, several contexts, bash, interrupts."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.server.conftest import Api


async def _sandbox(api: Api) -> str:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json={})
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


async def _run(api: Api, sandbox_id: str, code: str, **fields: Any) -> list[dict[str, Any]]:
    response = await api.client.post(
        f"/v1/sandboxes/{sandbox_id}/code/execute",
        headers=api.acme,
        json={"code": code, **fields},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert lines[-1] == {"type": "end_of_execution"}
    return lines


def _main(lines: list[dict[str, Any]]) -> dict[str, Any]:
    return next(line for line in lines if line["type"] == "result" and line["is_main_result"])


def _stdout(lines: list[dict[str, Any]]) -> str:
    return "".join(line["text"] for line in lines if line["type"] == "stdout")


@pytest.mark.every_store
async def test_state_persists_and_results_are_rich(live: Api) -> None:
    sandbox_id = await _sandbox(live)
    assert _stdout(await _run(live, sandbox_id, "x = 1\nprint('set')")) == "set\n"
    assert _main(await _run(live, sandbox_id, "x + 1"))["text"] == "2"
    error = next(line for line in await _run(live, sandbox_id, "1 / 0") if line["type"] == "error")
    assert error["name"] == "ZeroDivisionError" and "1 / 0" in error["traceback"]
    assert "<cell-" in error["traceback"] and "_kernel" not in error["traceback"]
    frame = await _run(
        live, sandbox_id, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"
    )
    assert "<table" in _main(frame)["html"]
    plot = await _run(
        live,
        sandbox_id,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
    )
    [figure] = [line for line in plot if line["type"] == "result" and "png" in line]
    assert base64.b64decode(figure["png"]).startswith(b"\x89PNG\r\n\x1a\n")
    counts = [line for line in plot if line["type"] == "number_of_executions"]
    assert counts == [{"type": "number_of_executions", "execution_count": 5}]


async def test_contexts_are_independent(live: Api) -> None:
    sandbox_id = await _sandbox(live)
    base = f"/v1/sandboxes/{sandbox_id}/code/contexts"
    one = (await live.client.post(base, headers=live.acme, json={})).json()
    two = (await live.client.post(base, headers=live.acme, json={"cwd": "/tmp"})).json()
    assert two["cwd"] == "/tmp" and one["language"] == "python"
    await _run(live, sandbox_id, "secret = 42", context_id=one["id"])
    other = await _run(live, sandbox_id, "secret", context_id=two["id"])
    assert any(line.get("name") == "NameError" for line in other)
    listed = (await live.client.get(base, headers=live.acme)).json()
    assert {one["id"], two["id"]} <= {context["id"] for context in listed}
    restarted = await live.client.post(f"{base}/{one['id']}/restart", headers=live.acme)
    assert restarted.status_code == 204
    after = await _run(live, sandbox_id, "secret", context_id=one["id"])
    assert any(line.get("name") == "NameError" for line in after), "a restart drops state"
    removed = await live.client.delete(f"{base}/{two['id']}", headers=live.acme)
    assert removed.status_code == 204
    gone = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/code/execute",
        headers=live.acme,
        json={"code": "1", "context_id": two["id"]},
    )
    assert gone.status_code == 404


async def test_a_runaway_cell_is_interrupted_and_the_context_kept(live: Api) -> None:
    sandbox_id = await _sandbox(live)
    await _run(live, sandbox_id, "kept = 'yes'")
    stopped = await _run(live, sandbox_id, "while True: pass", timeout=0.5)
    assert any(line.get("name") == "KeyboardInterrupt" for line in stopped)
    assert _main(await _run(live, sandbox_id, "kept"))["text"] == "yes"


async def test_bash_is_a_second_language(live: Api) -> None:
    sandbox_id = await _sandbox(live)
    await _run(live, sandbox_id, "export GREETING=hello; cd /tmp", language="bash")
    lines = await _run(live, sandbox_id, "echo $GREETING from $(pwd)", language="bash")
    assert _stdout(lines) == "hello from /tmp\n"
    failed = await _run(live, sandbox_id, "exit_code() { return 3; }; exit_code", language="bash")
    assert any(line.get("name") == "ExitStatus" and line["value"] == "3" for line in failed)


async def test_bad_code_calls_are_4xx_and_tenants_are_apart(live: Api) -> None:
    sandbox_id = await _sandbox(live)
    url = f"/v1/sandboxes/{sandbox_id}/code/execute"
    for body in ({}, {"code": 1}, {"code": "1", "language": "cobol"},
                 {"code": "1", "language": "python", "context_id": "x"}):  # fmt: skip
        response = await live.client.post(url, headers=live.acme, json=body)
        assert response.status_code == 400, (body, response.text)
    theirs = await live.client.post(url, headers=live.globex, json={"code": "1"})
    assert theirs.status_code == 404


async def test_javascript_when_the_template_has_node(live: Api) -> None:
    sandbox_id = await _sandbox(live)
    await _run(live, sandbox_id, "let total = 40", language="javascript")
    lines = await _run(live, sandbox_id, "console.log('hi'); total + 2", language="js")
    assert _stdout(lines) == "hi\n" and _main(lines)["text"] == "42"
    error = [line for line in await _run(live, sandbox_id, "null.x", language="js")
             if line["type"] == "error"]  # fmt: skip
    assert error[0]["name"] == "TypeError"
    awaited = await _run(live, sandbox_id, "Promise.resolve(7)", language="javascript")
    assert _main(awaited)["text"] == "7"
    stopped = await _run(live, sandbox_id, "while (true) {}", language="js", timeout=0.5)
    assert any(line["type"] == "error" for line in stopped)
    assert _main(await _run(live, sandbox_id, "total", language="js"))["text"] == "40"


async def test_a_cell_is_interrupted_when_its_caller_goes_away(live: Api) -> None:
    """Through the server's hop too: a client that stops reading (an SDK's own timeout, a
    cancelled agent) must not leave its cell running in the sandbox."""
    import asyncio

    sandbox_id = await _sandbox(live)
    await _run(live, sandbox_id, "kept = 42")
    ticking = (
        "import time\nprint('started', flush=True)\n"
        "for i in range(100000):\n    open('/tmp/ticks', 'w').write(str(i)); time.sleep(0.02)"
    )
    async with live.client.stream(
        "POST", f"/v1/sandboxes/{sandbox_id}/code/execute", headers=live.acme,
        json={"code": ticking},
    ) as answer:  # fmt: skip
        lines = answer.aiter_lines()
        assert json.loads(await anext(lines))["type"] == "stdout"
    # The caller has gone away: its connection to the server is closed.

    async def ticks() -> str:
        return _stdout(await _run(live, sandbox_id, "cat /tmp/ticks", language="bash"))

    for _ in range(100):
        before = await ticks()
        await asyncio.sleep(0.3)
        if await ticks() == before:
            break
    else:
        raise AssertionError("the cell ran on after its caller left")
    assert _main(await _run(live, sandbox_id, "kept"))["text"] == "42", "the context was kept"
