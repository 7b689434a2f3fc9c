"""The MCP tools, driven by the official MCP client over stdio and streamable HTTP, against
a real server with real sandboxes."""

from __future__ import annotations

import asyncio
import base64

import anyio
import httpx
import pytest

from tests.mcp.conftest import Connect, LiveServer, structured, tool_error

TOOLS = {
    "sandbox_create", "sandbox_list", "sandbox_get", "sandbox_set_timeout", "sandbox_kill",
    "run_command", "run_code", "code_context_create", "files_read", "files_write", "files_list",
    "remediation_propose", "remediation_status", "sandbox_checkpoint", "sandbox_rollback",
    "sandbox_pause", "sandbox_resume", "sandbox_fork", "browse",
}  # fmt: skip


async def test_the_tools_have_precise_schemas_and_none_approves(
    live: LiveServer, connect: Connect
) -> None:
    async with connect(live.key) as client:
        tools = (await client.list_tools()).tools
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        assert tool.description and len(tool.description) > 40, tool.name
        schema = tool.input_schema
        assert schema["type"] == "object"
        for name, field in schema["properties"].items():
            assert field.get("description"), f"{tool.name}.{name} has no description"
        assert "ctx" not in schema["properties"], "the context is not an argument"
        assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
        assert tool.annotations is not None, tool.name
    by_name = {t.name: t for t in tools}
    command = by_name["run_command"].input_schema
    assert command["required"] == ["sandbox_id", "command"]
    assert command["properties"]["timeout"]["maximum"] == 3600
    assert by_name["sandbox_kill"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert by_name["sandbox_list"].annotations.read_only_hint is True  # type: ignore[union-attr]
    assert not any("approve" in t.name or "reject" in t.name for t in tools)


@pytest.mark.every_store
async def test_an_agent_creates_drives_and_kills_a_sandbox(
    live: LiveServer, connect: Connect
) -> None:
    async with connect(live.key) as client:
        created = structured(
            await client.call_tool(
                "sandbox_create", {"timeout": 120, "metadata": {"task": "mcp"}, "memory": "256M"}
            )
        )
        sid = created["sandbox_id"]
        assert created["state"] == "running" and created["metadata"] == {"task": "mcp"}
        assert created["limits"]["memory_bytes"] == 256 << 20

        ran = structured(
            await client.call_tool(
                "run_command",
                {"sandbox_id": sid, "command": "echo out; echo err >&2; exit 3"},
            )
        )
        assert ran == {
            "sandbox_id": sid, "exit_code": 3, "stdout": "out\n", "stdout_truncated": False,
            "stderr": "err\n", "stderr_truncated": False, "timed_out": False, "error": None,
        }  # fmt: skip

        written = structured(
            await client.call_tool(
                "files_write", {"sandbox_id": sid, "path": "notes/a.txt", "content": "héllo\n"}
            )
        )
        assert written == {
            "sandbox_id": sid, "path": "/home/user/notes/a.txt", "bytes_written": 7
        }  # fmt: skip
        read = structured(
            await client.call_tool("files_read", {"sandbox_id": sid, "path": "notes/a.txt"})
        )
        assert read["content"] == "héllo\n" and read["truncated"] is False
        assert read["sandbox_id"] == sid
        seen = structured(
            await client.call_tool("run_command", {"sandbox_id": sid, "command": "cat notes/a.txt"})
        )
        assert seen["stdout"] == "héllo\n", "the file is the sandbox's, as commands see it"
        listed = structured(
            await client.call_tool("files_list", {"sandbox_id": sid, "path": "notes"})
        )
        assert [(e["name"], e["type"], e["size"]) for e in listed["entries"]] == [
            ("a.txt", "file", 7)
        ]

        structured(await client.call_tool("run_code", {"sandbox_id": sid, "code": "x = 6 * 7"}))
        cell = structured(
            await client.call_tool("run_code", {"sandbox_id": sid, "code": "print('hi')\nx"})
        )
        assert cell["text"] == "42", "state stays between cells"
        assert cell["stdout"] == "hi\n" and cell["error"] is None and cell["sandbox_id"] == sid
        failed = structured(await client.call_tool("run_code", {"sandbox_id": sid, "code": "1/0"}))
        assert failed["error"]["name"] == "ZeroDivisionError", "an exception is data"
        context = structured(await client.call_tool("code_context_create", {"sandbox_id": sid}))
        fresh = structured(
            await client.call_tool(
                "run_code",
                {"sandbox_id": sid, "context_id": context["context_id"], "code": "'x' in dir()"},
            )
        )
        assert fresh["text"] == "False" and fresh["context_id"] == context["context_id"]

        moved = structured(
            await client.call_tool("sandbox_set_timeout", {"sandbox_id": sid, "timeout": 600})
        )
        assert moved["expires_at"] > created["expires_at"]
        mine = structured(
            await client.call_tool(
                "sandbox_list", {"metadata": {"task": "mcp"}, "state": ["running"]}
            )
        )
        assert sid in [s["sandbox_id"] for s in mine["sandboxes"]]

        killed = structured(await client.call_tool("sandbox_kill", {"sandbox_id": sid}))
        assert killed["state"] == "killed"
        after = tool_error(
            await client.call_tool("run_command", {"sandbox_id": sid, "command": "true"})
        )
        assert "sandbox_not_running" in after
        assert (
            structured(await client.call_tool("sandbox_get", {"sandbox_id": sid}))["state"]
            == "killed"
        )


async def test_results_are_bounded_and_say_so(live: LiveServer, connect: Connect) -> None:
    async with connect(live.key) as client:
        sid = structured(await client.call_tool("sandbox_create", {"timeout": 120}))["sandbox_id"]
        try:
            long = structured(
                await client.call_tool(
                    "run_command",
                    {"sandbox_id": sid, "command": "seq 1 100000", "max_output_chars": 1000},
                )
            )
            assert long["stdout_truncated"] is True and long["exit_code"] == 0
            assert long["stdout"].startswith("1\n2\n") and long["stdout"].endswith(
                "99999\n100000\n"
            )
            assert "characters cut" in long["stdout"] and len(long["stdout"]) < 1100

            data = bytes(range(256)) * 40
            structured(
                await client.call_tool(
                    "files_write",
                    {"sandbox_id": sid, "path": "blob", "encoding": "base64",
                     "content": base64.b64encode(data).decode()},
                )
            )  # fmt: skip
            head = structured(
                await client.call_tool(
                    "files_read",
                    {"sandbox_id": sid, "path": "blob", "encoding": "base64", "max_bytes": 1000},
                )
            )
            assert base64.b64decode(head["content"]) == data[:1000]
            assert head["truncated"] is True and head["bytes_read"] == 1000
            not_text = tool_error(
                await client.call_tool("files_read", {"sandbox_id": sid, "path": "blob"})
            )
            assert "invalid_request" in not_text and "base64" in not_text

            structured(
                await client.call_tool(
                    "run_command", {"sandbox_id": sid, "command": "mkdir d && touch d/f{1..30}"}
                )
            )
            some = structured(
                await client.call_tool(
                    "files_list", {"sandbox_id": sid, "path": "d", "max_entries": 10}
                )
            )
            assert len(some["entries"]) == 10 and some["truncated"] is True
        finally:
            await client.call_tool("sandbox_kill", {"sandbox_id": sid})


async def test_a_command_past_its_timeout_or_its_output_limit_is_killed(
    live: LiveServer, connect: Connect
) -> None:
    async with connect(live.key) as client:
        sid = structured(await client.call_tool("sandbox_create", {"timeout": 300}))["sandbox_id"]
        try:
            slow = structured(
                await client.call_tool(
                    "run_command",
                    {"sandbox_id": sid, "command": "echo started; sleep 60", "timeout": 1},
                )
            )
            assert slow["timed_out"] is True and slow["exit_code"] is None
            assert slow["stdout"] == "started\n", "the output so far comes back"
            # Endless output: killed at the limit (long before its 120 s timeout), which
            # only works if the output streams through the server while the command runs.
            flood = structured(
                await client.call_tool(
                    "run_command", {"sandbox_id": sid, "command": "yes", "timeout": 120}
                )
            )
            assert flood["timed_out"] is False and "16 MiB" in (flood["error"] or "")
            assert flood["stdout_truncated"] is True and flood["exit_code"] == -1
            alive = structured(
                await client.call_tool("run_command", {"sandbox_id": sid, "command": "echo ok"})
            )
            assert alive["stdout"] == "ok\n", "the sandbox serves on"
        finally:
            await client.call_tool("sandbox_kill", {"sandbox_id": sid})


async def test_bad_calls_are_tool_errors_and_the_server_serves_on(
    live: LiveServer, connect: Connect
) -> None:
    async with connect(live.key) as client:
        missing = tool_error(await client.call_tool("sandbox_get", {"sandbox_id": "sbnope"}))
        assert "not_found" in missing and "sbnope" in missing
        assert "timeout" in tool_error(await client.call_tool("sandbox_create", {"timeout": -1}))
        assert "memory" in tool_error(await client.call_tool("sandbox_create", {"memory": "lots"}))
        assert "command" in tool_error(
            await client.call_tool("run_command", {"sandbox_id": "sbnope"})
        )
        assert "not_found" in tool_error(
            await client.call_tool("remediation_status", {"proposal_id": "cpnope"})
        )
        assert "invalid_request" in tool_error(
            await client.call_tool(
                "files_write",
                {"sandbox_id": "x", "path": "a", "content": "@@", "encoding": "base64"},
            )
        )
        sid = structured(await client.call_tool("sandbox_create", {}))["sandbox_id"]
        try:
            directory = tool_error(
                await client.call_tool("files_read", {"sandbox_id": sid, "path": "/home"})
            )
            assert "invalid_request" in directory
            absent = tool_error(
                await client.call_tool("files_read", {"sandbox_id": sid, "path": "nothing"})
            )
            assert "not_found" in absent
        finally:
            await client.call_tool("sandbox_kill", {"sandbox_id": sid})
        assert len((await client.list_tools()).tools) == len(TOOLS)


async def test_another_tenants_key_sees_nothing(live: LiveServer, connect: Connect) -> None:
    async with connect(live.key) as owner, connect(live.other_key) as other:
        sid = structured(
            await owner.call_tool("sandbox_create", {"metadata": {"owner": "default"}})
        )["sandbox_id"]
        try:
            listed = structured(await other.call_tool("sandbox_list", {"limit": 100}))
            assert sid not in [s["sandbox_id"] for s in listed["sandboxes"]]
            for name, arguments in [
                ("sandbox_get", {}),
                ("sandbox_set_timeout", {"timeout": 1}),
                ("run_command", {"command": "echo pwned"}),
                ("run_code", {"code": "1"}),
                ("files_read", {"path": "/etc/hostname"}),
                ("files_write", {"path": "x", "content": "pwned"}),
                ("files_list", {}),
                ("code_context_create", {}),
                ("sandbox_kill", {}),
            ]:
                message = tool_error(await other.call_tool(name, {"sandbox_id": sid, **arguments}))
                assert "not_found" in message, (name, message)
            proposal = structured(
                await owner.call_tool(
                    "remediation_propose", {"command": ["true"], "rationale": "mine"}
                )
            )
            assert "not_found" in tool_error(
                await other.call_tool(
                    "remediation_status", {"proposal_id": proposal["proposal_id"]}
                )
            )
            still = structured(await owner.call_tool("sandbox_get", {"sandbox_id": sid}))
            assert still["state"] == "running"
            assert (
                structured(await owner.call_tool("files_list", {"sandbox_id": sid}))["entries"]
                == []
            ), "nothing was written by the other tenant"
        finally:
            await owner.call_tool("sandbox_kill", {"sandbox_id": sid})


@pytest.mark.every_store
async def test_a_remediation_proposed_over_mcp_waits_for_a_human(
    live: LiveServer, connect: Connect
) -> None:
    agent, approver = live.mint_key("agent"), live.mint_key("approver")
    async with connect(agent) as client:
        proposal = structured(
            await client.call_tool(
                "remediation_propose",
                {"command": ["sh", "-c", "echo restarted $TARGET"], "env": {"TARGET": "web"},
                 "rationale": "the web pod is stuck", "remediation_action": "restart"},
            )
        )  # fmt: skip
        pid = proposal["proposal_id"]
        assert proposal["state"] == "pending" and proposal["execution"] is None
        assert "human" in proposal["note"]
        status = structured(await client.call_tool("remediation_status", {"proposal_id": pid}))
        assert status["state"] == "pending", "nothing runs without a human"

        approved = httpx.post(
            f"{live.url}/v1/proposals/{pid}/approve",
            headers={"Authorization": f"Bearer {approver}"},
            json={"digest": proposal["digest"], "reason": "checked"},
            timeout=60,
        )
        assert approved.status_code == 200, approved.text
        for _ in range(600):  # bounded: the command takes milliseconds once approved
            status = structured(await client.call_tool("remediation_status", {"proposal_id": pid}))
            if status["state"] in ("succeeded", "failed"):
                break
            await asyncio.sleep(0.05)
        assert status["state"] == "succeeded", status
        assert status["approvals"] == 1 and status["execution"]["logs"] == "restarted web\n"


async def test_a_cancelled_call_kills_its_command(live: LiveServer, connect: Connect) -> None:
    async with connect(live.key) as client:
        sid = structured(await client.call_tool("sandbox_create", {"timeout": 300}))["sandbox_id"]

        async def running() -> int:
            # [m] keeps pgrep from finding the shell that runs it
            check = {"sandbox_id": sid, "command": "pgrep -f 'cancel-[m]arker' | wc -l"}
            return int(structured(await client.call_tool("run_command", check))["stdout"])

        async def waited(count: int) -> int:
            for _ in range(400):  # bounded; each look is a round trip
                if (seen := await running()) == count:
                    break
                await anyio.sleep(0.05)
            return seen

        try:
            call = anyio.CancelScope()

            async def long_call() -> None:
                with call:
                    command = {"sandbox_id": sid, "command": "exec -a cancel-marker sleep 1000"}
                    await client.call_tool("run_command", {**command, "timeout": 900})

            async with anyio.create_task_group() as group:
                group.start_soon(long_call)
                assert await waited(1) == 1, "the command runs"
                call.cancel()
            assert await waited(0) == 0, "the cancelled call's command was killed"
        finally:
            await client.call_tool("sandbox_kill", {"sandbox_id": sid})


async def test_a_cells_picture_comes_back_as_an_image(live: LiveServer, connect: Connect) -> None:
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )
    cell = f"class Picture:\n    def _repr_png_(self): return {png!r}\ndisplay(Picture())\n'done'"
    async with connect(live.key) as client:
        sid = structured(await client.call_tool("sandbox_create", {}))["sandbox_id"]
        try:
            result = await client.call_tool("run_code", {"sandbox_id": sid, "code": cell})
        finally:
            await client.call_tool("sandbox_kill", {"sandbox_id": sid})
    outcome = structured(result)
    assert outcome["text"] == "done"
    pictures = [r for r in outcome["results"] if r["image_attached"]]
    assert len(pictures) == 1 and "png" in pictures[0]["formats"]
    images = [block for block in result.content if block.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data) == png
