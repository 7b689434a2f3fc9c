"""The Executor contract on the local backend, with real sandboxes."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.errors import DuplicateExecution, ExecutionNotFound, InvalidRequest
from ringfence.models import ExecutionRequest, Mount, ResourceLimits, Status


def _sh(script: str, **kwargs: object) -> ExecutionRequest:
    return ExecutionRequest(command=["sh", "-c", script], **kwargs)  # type: ignore[arg-type]


async def _wait_until_running(executor: LocalExecutor, execution_id: str) -> None:
    for _ in range(500):
        try:
            if (await executor.get_status(execution_id)).status is Status.RUNNING:
                return
        except ExecutionNotFound:
            pass
        await asyncio.sleep(0.01)
    raise AssertionError(f"{execution_id} never ran")


def _sandbox_cgroups(executor: LocalExecutor) -> list[str]:
    groups = executor._host.cgroups.groups.values()  # type: ignore[attr-defined]
    return [name for group in groups for name in os.listdir(group) if name.startswith("rf-")]


async def test_exit_status_decides_success(local_executor: LocalExecutor) -> None:
    ok = await local_executor.execute(_sh("exit 0"))
    assert (ok.status, ok.exit_code, ok.error) == (Status.SUCCEEDED, 0, None)
    bad = await local_executor.execute(_sh("exit 3"))
    assert (bad.status, bad.exit_code, bad.error) == (Status.FAILED, 3, None)
    assert bad.backend == "local" and bad.job_name == f"rf-{bad.execution_id}"
    assert bad.started_at is not None and bad.finished_at is not None
    assert bad.started_at <= bad.finished_at


async def test_stdout_and_stderr_are_captured_in_order(local_executor: LocalExecutor) -> None:
    result = await local_executor.execute(_sh("echo one; echo two >&2; echo three; echo four >&2"))
    assert result.logs == "one\ntwo\nthree\nfour\n"


async def test_output_is_streamed_as_produced(local_executor: LocalExecutor) -> None:
    chunks: list[tuple[float, bytes]] = []
    started = time.monotonic()
    result = await local_executor.execute(
        _sh("echo early; sleep 0.5; echo late"),
        on_output=lambda chunk: chunks.append((time.monotonic() - started, chunk)),
    )
    assert b"".join(c for _, c in chunks) == b"early\nlate\n"
    assert result.status is Status.SUCCEEDED
    assert chunks[0][1] == b"early\n" and chunks[0][0] < chunks[-1][0] - 0.3


async def test_a_failing_output_callback_does_not_break_the_execution(
    local_executor: LocalExecutor,
) -> None:
    def broken(chunk: bytes) -> None:
        raise RuntimeError("callback bug")

    result = await local_executor.execute(_sh("echo hi"), on_output=broken)
    assert result.status is Status.SUCCEEDED and result.logs == "hi\n"


async def test_only_the_requested_environment_is_set(local_executor: LocalExecutor) -> None:
    result = await local_executor.execute(
        ExecutionRequest(command=["env"], env={"GREETING": "hi", "LANG": "C"})
    )
    env = dict(line.split("=", 1) for line in result.logs.splitlines())
    assert env.pop("GREETING") == "hi" and env.pop("LANG") == "C"
    assert set(env) <= {
        "PATH", "HOME", "USER", "LOGNAME", "TERM", "PWD", "SHLVL", "_", "PIP_BREAK_SYSTEM_PACKAGES"
    }  # fmt: skip
    assert env["HOME"] == "/home/user" and env["USER"] == "user"


async def test_the_workspace_is_the_default_cwd_and_is_writable(
    local_executor: LocalExecutor,
) -> None:
    result = await local_executor.execute(
        _sh("pwd; echo data > f && cat f && echo tmp > /tmp/t && cat /tmp/t; id -un")
    )
    assert result.logs == "/home/user\ndata\ntmp\nuser\n", result.logs


async def test_a_timeout_kills_the_command_within_bounds(local_executor: LocalExecutor) -> None:
    started = time.monotonic()
    result = await local_executor.execute(ExecutionRequest(command=["sleep", "30"], timeout=1))
    elapsed = time.monotonic() - started
    assert result.status is Status.TIMED_OUT and result.exit_code is None
    assert result.error and "timed out" in result.error
    assert elapsed < 2.0, elapsed


async def test_status_is_readable_while_running_and_after(local_executor: LocalExecutor) -> None:
    request = _sh("echo started; sleep 30", timeout=20)
    task = asyncio.create_task(local_executor.execute(request))
    await _wait_until_running(local_executor, request.id)
    for _ in range(300):  # the output arrives shortly after the start
        running = await local_executor.get_status(request.id)
        if running.logs:
            break
        await asyncio.sleep(0.01)
    assert running.status is Status.RUNNING and running.logs == "started\n"
    assert running.finished_at is None
    cancelled = await local_executor.cancel(request.id)
    assert cancelled.status is Status.CANCELLED and cancelled.exit_code is None
    assert (await task).status is Status.CANCELLED
    after = await local_executor.get_status(request.id)
    assert after.status is Status.CANCELLED and after.logs == "started\n"


async def test_cancel_kills_the_whole_tree_and_leaves_nothing(
    local_executor: LocalExecutor,
) -> None:
    request = _sh("sleep 60 & sleep 60 & (sleep 60 &) ; wait", timeout=30)
    task = asyncio.create_task(local_executor.execute(request))
    await _wait_until_running(local_executor, request.id)
    assert f"rf-{request.id}" in _sandbox_cgroups(local_executor)
    started = time.monotonic()
    await local_executor.cancel(request.id)
    assert time.monotonic() - started < 2
    assert (await task).status is Status.CANCELLED
    assert f"rf-{request.id}" not in _sandbox_cgroups(local_executor)


async def test_cancelling_a_finished_execution_changes_nothing(
    local_executor: LocalExecutor,
) -> None:
    done = await local_executor.execute(_sh("echo hi"))
    assert await local_executor.cancel(done.execution_id) == done


async def test_unknown_ids_are_not_found(local_executor: LocalExecutor) -> None:
    with pytest.raises(ExecutionNotFound):
        await local_executor.get_status("no-such-execution")
    with pytest.raises(ExecutionNotFound):
        await local_executor.cancel("no-such-execution")


async def test_a_duplicate_id_is_rejected(local_executor: LocalExecutor) -> None:
    first = ExecutionRequest(id="same-id", command=["sleep", "30"], timeout=20)
    task = asyncio.create_task(local_executor.execute(first))
    await _wait_until_running(local_executor, "same-id")
    with pytest.raises(DuplicateExecution):
        await local_executor.execute(ExecutionRequest(id="same-id", command=["true"]))
    await local_executor.cancel("same-id")
    await task
    with pytest.raises(DuplicateExecution):
        await local_executor.execute(ExecutionRequest(id="same-id", command=["true"]))


async def test_aclose_cancels_what_still_runs(local_executor: LocalExecutor) -> None:
    request = ExecutionRequest(command=["sleep", "30"], timeout=20)
    task = asyncio.create_task(local_executor.execute(request))
    await _wait_until_running(local_executor, request.id)
    await local_executor.aclose()
    assert (await task).status is Status.CANCELLED
    assert f"rf-{request.id}" not in _sandbox_cgroups(local_executor)


async def test_a_cancelled_caller_leaves_nothing_behind(local_executor: LocalExecutor) -> None:
    request = ExecutionRequest(command=["sleep", "30"], timeout=20)
    task = asyncio.create_task(local_executor.execute(request))
    await _wait_until_running(local_executor, request.id)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await local_executor.get_status(request.id)).status is Status.CANCELLED
    assert f"rf-{request.id}" not in _sandbox_cgroups(local_executor)


async def test_the_cpu_limit_throttles_a_busy_loop(local_executor: LocalExecutor) -> None:
    spin = (
        "import time\n"
        "start, cpu = time.monotonic(), time.process_time()\n"
        "while time.monotonic() - start < 1.5: pass\n"
        "print(time.process_time() - cpu)\n"
    )
    result = await local_executor.execute(
        ExecutionRequest(command=["python3", "-c", spin], limits=ResourceLimits(cpus=0.2))
    )
    assert result.status is Status.SUCCEEDED, result
    # 1.5 s of wall time at 0.2 cores is 0.3 s of CPU; unthrottled it would be about 1.5 s.
    assert float(result.logs) < 0.6, result.logs


async def test_granted_mounts_are_read_only_unless_writable(
    local_executor: LocalExecutor, open_tmp: Path
) -> None:
    tmp_path = open_tmp
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "input.txt").write_text("from the host\n")
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # written by the sandbox's host uid
    result = await local_executor.execute(
        _sh(
            "cat /data/input.txt; (echo x > /data/new) 2>/dev/null || echo read-only; "
            "echo result > /out/result.txt",
            mounts=[
                Mount(source=str(shared), target="/data"),
                Mount(source=str(out), target="/out", writable=True),
            ],
        )
    )
    assert result.logs == "from the host\nread-only\n", result.logs
    assert (out / "result.txt").read_text() == "result\n"
    assert not (shared / "new").exists()


async def test_a_missing_mount_source_is_invalid(local_executor: LocalExecutor) -> None:
    with pytest.raises(InvalidRequest):
        await local_executor.execute(
            ExecutionRequest(command=["true"], mounts=[Mount.parse("/no/such/dir:/data")])
        )


async def test_a_missing_cwd_fails_with_the_reason_in_the_logs(
    local_executor: LocalExecutor,
) -> None:
    result = await local_executor.execute(ExecutionRequest(command=["true"], cwd="/no/such"))
    assert result.status is Status.FAILED
    assert "/no/such" in result.logs


async def test_the_command_cannot_pass_itself_off_as_a_setup_failure(
    local_executor: LocalExecutor,
) -> None:
    result = await local_executor.execute(_sh("echo 'bwrap: fake failure'; exit 1"))
    assert (result.status, result.exit_code, result.error) == (Status.FAILED, 1, None)
    result = await local_executor.execute(_sh("exit 137"))
    assert (result.exit_code, result.error) == (137, None), "137 is a plain exit status here"


async def test_an_unreadable_mount_source_is_a_setup_failure(
    local_executor: LocalExecutor, tmp_path: Path
) -> None:
    # pytest's tmp_path is private to root: the sandbox user cannot reach it.
    result = await local_executor.execute(
        ExecutionRequest(command=["true"], mounts=[Mount(source=str(tmp_path), target="/d")])
    )
    assert result.status is Status.FAILED and result.exit_code is None
    assert result.error and result.error.startswith("sandbox setup failed")
    assert "Permission denied" in result.error, result.error


async def test_a_missing_program_fails_with_its_message(local_executor: LocalExecutor) -> None:
    result = await local_executor.execute(ExecutionRequest(command=["no-such-program"]))
    assert result.status is Status.FAILED
    assert "no-such-program" in result.logs


async def test_a_directory_rootfs_is_the_whole_world(
    local_executor: LocalExecutor, open_tmp: Path
) -> None:
    busybox = shutil.which("busybox")
    assert busybox, "scripts/setup installs busybox-static"
    root = open_tmp / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in ("sh", "ls", "cat", "id"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "bin" / "busybox").chmod(0o755)
    result = await local_executor.execute(
        ExecutionRequest(
            image=str(root),
            command=["/bin/sh", "-c", "ls /; ls /usr 2>&1; id -un"],
            env={"PATH": "/bin"},
        )
    )
    assert result.status is Status.SUCCEEDED, result
    listing = result.logs.split()
    assert {"bin", "etc", "home", "proc", "tmp"} <= set(listing)
    assert "usr" not in listing[: listing.index("tmp") + 1], "nothing of the host's tree"
    assert result.logs.strip().endswith("user"), "the generated passwd names the sandbox user"


async def test_nothing_remains_after_many_executions(local_executor: LocalExecutor) -> None:
    results = await asyncio.gather(*(local_executor.execute(_sh(f"echo {i}")) for i in range(16)))
    assert [r.logs for r in results] == [f"{i}\n" for i in range(16)]
    left = set(_sandbox_cgroups(local_executor))
    assert not left & {f"rf-{r.execution_id}" for r in results}


def _processes_with(marker: bytes) -> list[int]:
    """Host processes whose environment holds ``marker`` (a variable only they were given)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/environ").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


async def test_a_start_cancelled_before_the_sandbox_is_in_its_cgroup_leaves_nothing(
    local_executor: LocalExecutor,
) -> None:
    # The caller's first suspension is while bwrap's init is spawned but not yet moved into
    # its cgroup: a kill of the cgroup then misses it, and the gate closing lets it run the
    # command. Nothing of it may outlive the cancel.
    request = ExecutionRequest(command=["sleep", "30"], env={"RF_CANCEL_MARK": "1"}, timeout=20)
    task = asyncio.create_task(local_executor.execute(request))
    await asyncio.sleep(0)  # the execution runs up to its first suspension
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    marker = b"RF_CANCEL_MARK=1\0"
    for _ in range(100):  # bounded: SIGKILLed processes take a moment to be gone
        if not _processes_with(marker):
            break
        await asyncio.sleep(0.05)
    assert _processes_with(marker) == []
    assert f"rf-{request.id}" not in _sandbox_cgroups(local_executor)
