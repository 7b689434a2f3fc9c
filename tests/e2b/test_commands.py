"""``sbx.commands`` through the unmodified E2B SDK: envd's process service, passed through."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from e2b import CommandExitException, NotFoundException, Sandbox, SandboxException
from tests.e2b.conftest import E2bServer, audit_records


@pytest.fixture(scope="module")
def sbx(e2b_server: E2bServer) -> Iterator[Sandbox]:
    with Sandbox.create(timeout=600) as sandbox:
        yield sandbox


def test_run_returns_output_and_exit_code(sbx: Sandbox) -> None:
    result = sbx.commands.run("echo out; echo err >&2; pwd; whoami")
    assert result.exit_code == 0
    assert result.stdout == "out\n/home/user\nuser\n" and result.stderr == "err\n"


def test_a_failing_command_raises_command_exit_exception(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as caught:
        sbx.commands.run("echo partial; exit 3")
    assert caught.value.exit_code == 3 and caught.value.stdout == "partial\n"


def test_envs_and_cwd_apply_to_one_command(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/work")
    result = sbx.commands.run("echo $A-$B; pwd", envs={"A": "1", "B": "two"}, cwd="/home/user/work")
    assert result.stdout == "1-two\n/home/user/work\n"


def test_streaming_callbacks_see_each_chunk(sbx: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    sbx.commands.run(
        "for i in 1 2 3; do echo $i; echo e$i >&2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "1\n2\n3\n" and "".join(err) == "e1\ne2\ne3\n"


def test_background_command_waits_lists_connects_and_is_killed(sbx: Sandbox) -> None:
    handle = sbx.commands.run("touch started; sleep 600", background=True)
    assert handle.pid in {p.pid for p in sbx.commands.list()}
    listed = next(p for p in sbx.commands.list() if p.pid == handle.pid)
    assert listed.cmd == "/bin/bash" and "sleep 600" in " ".join(listed.args)
    deadline = time.monotonic() + 10
    while not sbx.files.exists("started") and time.monotonic() < deadline:
        time.sleep(0.02)

    attached = sbx.commands.connect(handle.pid)
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as caught:
        handle.wait()
    assert caught.value.exit_code != 0
    with pytest.raises(CommandExitException):
        attached.wait()
    assert handle.pid not in {p.pid for p in sbx.commands.list()}
    assert sbx.commands.kill(handle.pid) is False, "an ended process is not found"


def test_background_wait_returns_the_result(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 0.2; echo done", background=True)
    assert handle.wait().stdout == "done\n"


def test_stdin_reaches_the_process_and_close_ends_it(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "line one\n")
    sbx.commands.send_stdin(handle.pid, b"line two\n")
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "line one\nline two\n"


def test_connecting_to_an_unknown_pid_is_not_found(sbx: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sbx.commands.connect(999_999)


def test_root_runs_as_root_inside_and_another_user_is_refused(sbx: Sandbox) -> None:
    assert sbx.commands.run("id -u", user="root").stdout == "0\n"
    with pytest.raises(SandboxException, match="bob"):
        sbx.commands.run("id -u", user="bob")  # type: ignore[arg-type]
    assert sbx.commands.run("id -un", user="user").stdout == "user\n"


def test_a_timeout_ends_the_command(sbx: Sandbox) -> None:
    from e2b import TimeoutException

    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)


def test_commands_are_on_the_audit_record(e2b_server: E2bServer, sbx: Sandbox) -> None:
    sbx.commands.run("echo audited-e2b-command")
    records = audit_records(e2b_server, f"sandbox:{sbx.sandbox_id}", "sandbox.Start", "audited-e2b")
    assert any("audited-e2b-command" in str(r["details"]["command"]) for r in records)  # type: ignore[index]
    assert {r["actor"] for r in records} == {e2b_server.key.split("_")[1]}


def test_stream_input_feeds_stdin_in_order(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(handle.pid, iter(["one\n", b"two\n"]))
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "one\ntwo\n"


def test_disconnect_leaves_the_command_running(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 600", background=True)
    handle.disconnect()
    assert handle.pid in {p.pid for p in sbx.commands.list()}
    assert sbx.commands.kill(handle.pid) is True


def test_git_helpers_run_the_sandboxs_git(sbx: Sandbox) -> None:
    sbx.git.init("/home/user/repo")
    sbx.files.write("/home/user/repo/a.txt", "a")
    status = sbx.git.status("/home/user/repo")
    assert status.current_branch and [f.name for f in status.file_status] == ["a.txt"]
