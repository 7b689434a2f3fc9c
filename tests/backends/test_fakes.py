"""What the fakes promise beyond the contract: the fake shell's exact semantics, programs a
test adds, and a fake sandbox's kill reaching what its daemon started."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from ringfence.backends import LaunchSpec
from ringfence.models import ExecutionRequest, ResourceLimits, Status
from ringfence.service.daemon_client import DaemonClient
from ringfence.testing.backend_checks import WAIT, checked_config, frames, run_in_sandbox
from ringfence.testing.fakes import FAKE_HOME, FakeExecutor, FakeProcess, FakeSandboxRuntime
from ringfence.testing.fakes.runtime import descendants


async def _run(command: list[str], **fields: object) -> tuple[Status, int | None, str]:
    executor = FakeExecutor(checked_config())
    try:
        result = await executor.execute(ExecutionRequest(command=command, **fields))  # type: ignore[arg-type]
    finally:
        await executor.aclose()
    return result.status, result.exit_code, result.logs


@pytest.mark.parametrize(
    ("script", "code", "logs"),
    [
        ("echo hi; exit 3", 3, "hi\n"),
        ("echo -n a; echo b", 0, "ab\n"),
        ("false || echo ok && echo and", 0, "ok\nand\n"),
        ("true && false; echo $?", 0, "1\n"),
        ("echo \"$GREETING, ${WHO}\" '$WHO' \\$", 0, "hello, you $WHO $\n"),
        ("echo $0 $1 $2", 0, "name first \n"),
        ("echo to stderr >&2", 0, "to stderr\n"),
        ("seq 2 4", 0, "2\n3\n4\n"),
        ("printenv WHO", 0, "you\n"),
        ("exit", 0, ""),
        ("missing-program x", 127, "fake: missing-program: command not found\n"),
        ("A=1", 127, "fake: A=1: command not found\n"),
        ("echo a | cat", 2, "fake sh: '|' is not understood (pipes, redirections, globs, ...)\n"),
        ("echo 'open", 2, "fake sh: unterminated single quote\n"),
    ],
)
async def test_the_fake_shell_does_exactly_what_it_documents(
    script: str, code: int, logs: str
) -> None:
    env = {"GREETING": "hello", "WHO": "you"}
    status, exit_code, output = await _run(["sh", "-c", script, "name", "first"], env=env)
    assert (exit_code, output) == (code, logs)
    assert status is (Status.SUCCEEDED if code == 0 else Status.FAILED)


async def test_commands_see_a_home_and_their_environment() -> None:
    _, _, logs = await _run(["printenv", "HOME", "PATH"])
    assert logs == f"{FAKE_HOME}\n/usr/bin:/bin\n"


async def test_a_program_a_test_adds_wins_and_can_wait_for_the_test() -> None:
    released = asyncio.Event()

    async def gated(process: FakeProcess) -> int:
        process.say(f"waiting in {process.cwd}\n")
        await released.wait()
        return int(process.argv[1])

    executor = FakeExecutor(checked_config(), programs={"gated": gated, "echo": gated})
    started = asyncio.Event()
    request = ExecutionRequest(command=["gated", "7"], cwd="/work")
    task = asyncio.create_task(executor.execute(request, on_start=lambda _: started.set()))
    await asyncio.wait_for(started.wait(), WAIT)
    assert (await executor.get_status(request.id)).status is Status.RUNNING
    released.set()
    result = await asyncio.wait_for(task, WAIT)
    assert (result.exit_code, result.logs) == (7, "waiting in /work\n")
    assert executor.requests == [request]
    await executor.aclose()


async def test_a_program_that_raises_fails_its_execution_and_says_why() -> None:
    async def broken(process: FakeProcess) -> int:
        raise ValueError("a bug in a test program")

    executor = FakeExecutor(checked_config(), programs={"broken": broken})
    result = await executor.execute(ExecutionRequest(command=["broken"]))
    assert (result.status, result.exit_code) == (Status.FAILED, 1)
    assert "raised ValueError('a bug in a test program')" in result.logs
    await executor.aclose()


async def test_the_fake_executor_cannot_pass_descriptors() -> None:
    executor = FakeExecutor(checked_config())
    result = await executor.execute(ExecutionRequest(command=["true"]), pass_fds=(0,))
    assert result.status is Status.FAILED and "cannot pass descriptors" in (result.error or "")
    await executor.aclose()


async def test_a_fake_sandboxs_kill_reaches_the_sessions_its_daemon_started() -> None:
    runtime = FakeSandboxRuntime(checked_config())
    spec = LaunchSpec(image="base", env={}, limits=ResourceLimits(), timeout=120)
    client: DaemonClient | None = None
    try:
        sandbox = await runtime.start(spec)
        assert runtime.specs == [spec]
        client = DaemonClient("fake", sandbox.socket_path)
        await client.health(WAIT)
        payload = json.dumps({"process": {"cmd": "sleep", "args": ["600"]}}).encode()
        response = await client.send(
            "POST", "/process.Process/Start",
            headers={"content-type": "application/connect+json"},
            content=struct.pack(">BI", 0, len(payload)) + payload,
        )  # fmt: skip
        async for _, message in frames(response.aiter_raw()):
            pid = int(message["event"]["start"]["pid"])
            break
        assert os.getsid(pid) != os.getsid(0), "the daemon started it in a session of its own"
        assert (await sandbox.kill()).status is Status.CANCELLED
        async with asyncio.timeout(WAIT):
            while _alive(pid):
                await asyncio.sleep(0.01)
    finally:
        if client is not None:
            await client.aclose()
        await runtime.aclose()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_descendants_are_found_through_proc_grandchildren_too() -> None:
    shell = subprocess.Popen(["sh", "-c", "sleep 600; exit 0"])
    try:
        async with asyncio.timeout(WAIT):
            while not descendants(shell.pid):  # until sh has started its sleep
                await asyncio.sleep(0.01)
        (sleep,) = descendants(shell.pid)
        assert {shell.pid, sleep} <= set(descendants(os.getpid()))
    finally:
        shell.kill()
        shell.wait()
    os.kill(sleep, 9)


async def test_each_fake_sandbox_has_a_home_of_its_own_at_home_user() -> None:
    runtime = FakeSandboxRuntime(checked_config())
    spec = LaunchSpec(image="base", env={}, limits=ResourceLimits(), timeout=120)
    try:
        first, second = await runtime.start(spec), await runtime.start(spec)
        script = 'echo "$HOME $(pwd)"; echo mine > f; cat /home/user/f'
        output, code = await run_in_sandbox(first, "sh", "-c", script)
        assert (output, code) == ("/home/user /home/user\nmine\n", 0)
        output, code = await run_in_sandbox(second, "sh", "-c", "ls -A /home/user")
        assert (output, code) == ("", 0), "another sandbox's home is not this one's"
        assert not Path("/home/user/f").exists(), "the host's /home/user is untouched"
    finally:
        await runtime.aclose()


async def test_without_a_private_home_home_is_a_directory_on_the_host() -> None:
    runtime = FakeSandboxRuntime(checked_config(), private_home=False)
    spec = LaunchSpec(image="base", env={}, limits=ResourceLimits(), timeout=120)
    try:
        sandbox = await runtime.start(spec)
        output, _ = await run_in_sandbox(sandbox, "sh", "-c", 'echo "$HOME"')
        home = Path(output.strip())
        assert home.name.startswith("rf-fake-home-") and home.is_dir()
        await sandbox.kill()
        assert not home.exists(), "removed with its sandbox"
    finally:
        await runtime.aclose()


async def test_the_fake_executor_reports_the_backend_name_it_is_given() -> None:
    executor = FakeExecutor(checked_config(), name="local")
    result = await executor.execute(ExecutionRequest(command=["true"]))
    assert (executor.name, result.backend) == ("local", "local")
    await executor.aclose()
