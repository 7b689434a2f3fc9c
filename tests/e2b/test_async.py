"""The SDKs' async variants (``AsyncSandbox``), including the streamed ``WatchDir`` the sync
SDK does not use, and 32 sandboxes driven in parallel through the one port."""

from __future__ import annotations

import asyncio

import pytest
from e2b_code_interpreter import AsyncSandbox as AsyncCodeSandbox

from e2b import (
    AsyncSandbox,
    CommandExitException,
    FilesystemEvent,
    FilesystemEventType,
    SandboxNotFoundException,
    SandboxQuery,
)
from tests.e2b.conftest import E2bServer

PARALLEL = 32


async def test_async_sandbox_commands_and_files(e2b_server: E2bServer) -> None:
    sbx = await AsyncSandbox.create(timeout=120, metadata={"async": "yes"})
    try:
        result = await sbx.commands.run("echo async")
        assert result.stdout == "async\n"
        with pytest.raises(CommandExitException):
            await sbx.commands.run("exit 4")
        out: list[str] = []
        handle = await sbx.commands.run("echo a; sleep 0.1; echo b", background=True,
                                        on_stdout=out.append)  # fmt: skip
        assert (await handle.wait()).exit_code == 0 and "".join(out) == "a\nb\n"
        await sbx.files.write("/home/user/x.txt", "async file")
        assert await sbx.files.read("/home/user/x.txt") == "async file"
        assert [e.name for e in await sbx.files.list("/home/user")] == ["x.txt"]
        assert await sbx.files.exists("x.txt")
        info = await sbx.get_info()
        assert info.metadata == {"async": "yes"}
        await sbx.set_timeout(200)
        found = await AsyncSandbox.list(query=SandboxQuery(metadata={"async": "yes"})).next_items()
        assert sbx.sandbox_id in {s.sandbox_id for s in found}
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        assert (await again.commands.run("cat x.txt")).stdout == "async file"
    finally:
        assert await sbx.kill() is True
    with pytest.raises(SandboxNotFoundException):
        await sbx.get_info()


async def test_async_watch_dir_streams_events(e2b_server: E2bServer) -> None:
    async with await AsyncSandbox.create() as sbx:
        await sbx.files.make_dir("w/deeper")
        seen: asyncio.Queue[FilesystemEvent] = asyncio.Queue()
        handle = await sbx.files.watch_dir("w", on_event=seen.put_nowait, recursive=True)
        try:
            await sbx.files.write("w/deeper/f.txt", "x")
            async with asyncio.timeout(10):
                while not (event := await seen.get()).name.endswith("f.txt"):
                    pass
            assert event.type in {FilesystemEventType.CREATE, FilesystemEventType.WRITE}
        finally:
            await handle.stop()


async def test_async_code_interpreter(e2b_server: E2bServer) -> None:
    async with await AsyncCodeSandbox.create() as sbx:
        await sbx.run_code("total = 20")
        assert (await sbx.run_code("total * 2 + 2")).text == "42"
        context = await sbx.create_code_context()
        assert (await sbx.run_code("'total' in dir()", context=context)).text == "False"
        assert (await sbx.run_code("1/0")).error.name == "ZeroDivisionError"  # type: ignore[union-attr]


async def test_32_sandboxes_in_parallel_do_not_cross(e2b_server: E2bServer) -> None:
    async def one(n: int) -> tuple[str, str, str]:
        async with await AsyncCodeSandbox.create(timeout=120) as sbx:
            await sbx.files.write("/home/user/n.txt", str(n))
            ran = await sbx.commands.run("cat /home/user/n.txt; echo -n :$RINGFENCE_SANDBOX_ID")
            code = await sbx.run_code(f"open('/home/user/n.txt').read() + '/{n}'")
            return sbx.sandbox_id, ran.stdout, code.text or ""

    results = await asyncio.gather(*(one(n) for n in range(PARALLEL)))
    assert len({sandbox_id for sandbox_id, _, _ in results}) == PARALLEL
    for n, (sandbox_id, stdout, text) in enumerate(results):
        assert stdout == f"{n}:{sandbox_id}"
        assert text == f"{n}/{n}"
