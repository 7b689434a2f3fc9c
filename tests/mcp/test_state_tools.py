"""The state tools as an agent calls them: checkpoint, rollback, pause, resume, fork."""

from __future__ import annotations

from tests.mcp.conftest import Connect, LiveServer, structured, tool_error


async def test_an_agent_checkpoints_rolls_back_pauses_and_forks(
    live: LiveServer, connect: Connect
) -> None:
    async with connect(live.key) as client:
        sid = structured(await client.call_tool("sandbox_create", {"timeout": 300}))["sandbox_id"]
        children: list[str] = []
        try:
            write = {"sandbox_id": sid, "path": "notes.txt", "content": "before"}
            structured(await client.call_tool("files_write", write))
            made = structured(await client.call_tool("sandbox_checkpoint", {"sandbox_id": sid}))
            write["content"] = "after"
            structured(await client.call_tool("files_write", write))
            back = {"sandbox_id": sid, "checkpoint_id": made["checkpoint_id"]}
            assert structured(await client.call_tool("sandbox_rollback", back)) == back
            read = {"sandbox_id": sid, "path": "notes.txt"}
            assert structured(await client.call_tool("files_read", read))["content"] == "before"
            unknown = {"sandbox_id": sid, "checkpoint_id": "ck0"}
            assert "not_found" in tool_error(await client.call_tool("sandbox_rollback", unknown))

            paused = structured(await client.call_tool("sandbox_pause", {"sandbox_id": sid}))
            assert paused["memory"] is False and paused["sandbox"]["state"] == "paused"
            # Any call on it resumes it.
            assert structured(await client.call_tool("files_read", read))["content"] == "before"
            frozen = {"sandbox_id": sid, "memory": True}
            assert structured(await client.call_tool("sandbox_pause", frozen))["memory"] is True
            resumed = structured(await client.call_tool("sandbox_resume", {"sandbox_id": sid}))
            assert resumed["state"] == "running"

            forked = structured(
                await client.call_tool("sandbox_fork", {"sandbox_id": sid, "count": 2})
            )
            children = [child["sandbox_id"] for child in forked["children"]]
            assert len(set(children)) == 2 and sid not in children
            for child in children:
                on_child = {"sandbox_id": child, "path": "notes.txt"}
                content = structured(await client.call_tool("files_read", on_child))["content"]
                assert content == "before"
        finally:
            for made_id in [sid, *children]:
                await client.call_tool("sandbox_kill", {"sandbox_id": made_id})
