"""Attack: a cell floods ``run_code`` with results, unknown formats, output or a huge
exception, to exhaust the MCP server's memory and the agent's context. What the tool keeps is
bounded while the answer streams, the cell is stopped past the bound, and the server (and the
cell's context) serve on."""

from __future__ import annotations

from typing import Any

from mcp.client import Client

from tests.mcp.conftest import Connect, LiveServer, structured

# The whole text form of a run_code result at the default max_output_chars (20 000).
BOUND = 300_000


async def _run(client: Client, sid: str, code: str) -> dict[str, Any]:
    result = await client.call_tool("run_code", {"sandbox_id": sid, "code": code, "timeout": 300})
    text = result.content[0]
    assert text.type == "text"
    assert len(text.text) < BOUND, f"a {len(text.text)}-character tool result"
    return structured(result)


async def _serves_on(client: Client, sid: str) -> None:
    assert (await _run(client, sid, "6 * 7"))["text"] == "42", "the context serves on"


async def test_a_flood_of_results_is_cut_and_the_cell_stopped(
    live: LiveServer, connect: Connect
) -> None:
    async with connect(live.key) as client:
        sid = structured(await client.call_tool("sandbox_create", {"timeout": 300}))["sandbox_id"]
        try:
            flood = await _run(client, sid, "for i in range(100_000):\n    display(i)\n'end'")
            assert len(flood["results"]) == 50
            assert [r["text"] for r in flood["results"][:3]] == ["0", "1", "2"]
            assert flood["results_dropped"] > 0 and "results" in (flood["stopped"] or "")
            assert flood["text"] is None, "the cell was stopped before its last line"
            await _serves_on(client, sid)

            # A few results and a main one after them: the main one is kept.
            some = await _run(client, sid, "for i in range(60):\n    display(i)\n'end'")
            assert some["text"] == "end" and some["stopped"] is None
            assert len(some["results"]) == 50 and some["results_dropped"] == 11
            assert some["results"][-1] == {**some["results"][-1], "is_main_result": True}
        finally:
            await client.call_tool("sandbox_kill", {"sandbox_id": sid})


async def test_a_huge_exception_or_format_list_is_clipped(
    live: LiveServer, connect: Connect
) -> None:
    raising = "raise type('E' * 100_000, (Exception,), {})('v' * 5_000_000)"
    # The kernel's result protocol, spoken by the cell itself: 100 000 unknown formats.
    formats = (
        "display.__self__.send({'type': 'result', 'text': 'x', "
        "**{f'k{i}': i for i in range(100_000)}})"
    )
    async with connect(live.key) as client:
        sid = structured(await client.call_tool("sandbox_create", {"timeout": 300}))["sandbox_id"]
        try:
            error = (await _run(client, sid, raising))["error"]
            assert error["truncated"] is True
            assert error["name"].startswith("EEE") and len(error["name"]) < 300
            assert error["value"].startswith("vvv") and "characters cut" in error["value"]
            assert len(error["value"]) < 21_000 and len(error["traceback"]) < 21_000

            (result,) = (await _run(client, sid, formats))["results"]
            assert result["text"] == "x" and result["formats_truncated"] is True
            assert result["formats"][:2] == ["k0", "k1"] and len(result["formats"]) <= 20
            await _serves_on(client, sid)
        finally:
            await client.call_tool("sandbox_kill", {"sandbox_id": sid})


async def test_endless_output_stops_the_cell(live: LiveServer, connect: Connect) -> None:
    async with connect(live.key) as client:
        sid = structured(await client.call_tool("sandbox_create", {"timeout": 300}))["sandbox_id"]
        try:
            endless = await _run(client, sid, "while True:\n    print('x' * 10_000)")
            assert endless["stdout_truncated"] is True and "16 MiB" in (endless["stopped"] or "")
            await _serves_on(client, sid)
        finally:
            await client.call_tool("sandbox_kill", {"sandbox_id": sid})
