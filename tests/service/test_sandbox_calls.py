"""The daemon pass-through (``service.sandbox_calls``) against a real sandboxd: what goes on
the audit record, the one-user rule, and the answers' headers and refusals."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from ringfence.errors import Forbidden, InvalidRequest, SandboxError, SandboxNotFound
from ringfence.models import ResourceLimits
from ringfence.service import sandbox_calls
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.sandbox_calls import SandboxCaller, SandboxCalls
from tests.sandboxd.conftest import Daemon, wait_for

CALLER = SandboxCaller("acme", "key-1", "sbx-1")
UNARY = {"content-type": "application/json"}
STREAM = {"content-type": "application/connect+json"}


@dataclass
class Recorded:
    action: str
    sandbox_id: str
    actor: str
    details: Mapping[str, object] | None


@dataclass
class OneSandbox:
    """The sandbox service's part the calls use: one tenant's one sandbox."""

    daemon_client: DaemonClient
    records: list[Recorded] = field(default_factory=list)
    looked_up: int = 0

    async def daemon(self, tenant: str, sandbox_id: str) -> DaemonClient:
        self.looked_up += 1
        if (tenant, sandbox_id) != (CALLER.tenant, CALLER.sandbox_id):
            raise SandboxNotFound(f"no sandbox with id {sandbox_id!r}")
        return self.daemon_client

    async def get(self, tenant: str, sandbox_id: str) -> SimpleNamespace:
        return SimpleNamespace(limits=ResourceLimits(disk=1 << 20))

    def record(
        self,
        tenant: str,
        actor: str,
        action: str,
        sandbox_id: str,
        outcome: str = "ok",
        details: Mapping[str, object] | None = None,
    ) -> None:
        assert tenant == CALLER.tenant and outcome == "ok"
        self.records.append(Recorded(action, sandbox_id, actor, details))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A real sandboxd, as ``tests/sandboxd`` runs it."""
    tmp = tmp_path_factory.mktemp("sandboxd")
    (tmp / "home").mkdir()
    running = Daemon(tmp, tmp / "home")
    try:
        wait_for(lambda: running.client.get("/health").status_code == 204)
        yield running
    finally:
        running.client.close()
        running.proc.kill()
        running.proc.wait()


@pytest.fixture
async def sandbox(daemon: Daemon) -> AsyncIterator[OneSandbox]:
    client = DaemonClient(CALLER.sandbox_id, Path(daemon.path))
    try:
        yield OneSandbox(client)
    finally:
        await client.aclose()


async def _body(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _envelope(message: object) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


async def test_a_command_goes_on_the_record_without_its_variable_values(
    sandbox: OneSandbox,
) -> None:
    start = {"process": {"cmd": "/bin/echo", "args": ["hi"], "envs": {"B": "s3cret", "A": "x"}}}
    answer = await SandboxCalls(sandbox).rpc(
        CALLER, "process.Process/Start", STREAM, _body(_envelope(start))
    )
    assert answer.status == 200
    body = b"".join([chunk async for chunk in answer.stream()])
    assert b"aGkK" in body  # base64 of "hi\n": the command ran
    [record] = sandbox.records
    assert (record.action, record.sandbox_id, record.actor) == ("sandbox.Start", "sbx-1", "key-1")
    assert record.details == {"command": "/bin/echo hi", "cwd": "", "env": ["A", "B"]}
    assert "s3cret" not in json.dumps(record.details)


async def test_a_terminal_goes_on_the_record_with_its_size_never_its_input(
    sandbox: OneSandbox,
) -> None:
    start = {
        "process": {"cmd": "/bin/sh", "args": ["-c", "exit"]},
        "pty": {"size": {"rows": 9, "cols": 33}},
    }
    answer = await SandboxCalls(sandbox).rpc(
        CALLER, "process.Process/Start", STREAM, _body(_envelope(start))
    )
    await answer.aread()
    typed = {"process": {"pid": 1}, "input": {"pty": "czNjcjN0"}}  # base64 of "s3cr3t"
    answer = await SandboxCalls(sandbox).rpc(
        CALLER, "process.Process/SendInput", UNARY, _body(json.dumps(typed).encode())
    )
    await answer.aread()
    started, sent = sandbox.records
    assert started.details == {
        "command": "/bin/sh -c exit", "cwd": "", "env": [], "pty": "9x33"
    }  # fmt: skip
    assert sent.action == "sandbox.SendInput" and "czNjcjN0" not in json.dumps(sent.details)


async def test_a_call_that_only_looks_is_not_on_the_record(sandbox: OneSandbox) -> None:
    answer = await SandboxCalls(sandbox).rpc(CALLER, "process.Process/List", UNARY, _body(b"{}"))
    assert answer.status == 200
    assert "processes" in json.loads(await answer.aread())
    assert sandbox.records == []


async def test_a_stream_of_requests_is_on_the_record_without_being_read_first(
    sandbox: OneSandbox,
) -> None:
    calls = SandboxCalls(sandbox)
    consumed: list[bytes] = []

    async def body() -> AsyncIterator[bytes]:
        assert sandbox.records, "the record is made before the body is read"
        consumed.append(b"")
        yield struct.pack(">BI", 2, 2) + b"{}"  # the end of the stream, at once

    answer = await calls.rpc(CALLER, "process.Process/StreamInput", STREAM, body())
    await answer.aread()
    assert consumed and [r.action for r in sandbox.records] == ["sandbox.StreamInput"]
    assert sandbox.records[0].details is None


async def test_another_user_is_refused_before_the_sandbox_is_found(sandbox: OneSandbox) -> None:
    calls = SandboxCalls(sandbox)
    with pytest.raises(Forbidden) as refused:
        await calls.read_file(CALLER, "x.txt", {}, user="bob")
    assert refused.value.code == Forbidden.code
    with pytest.raises(Forbidden):
        await calls.file_writer(CALLER, user="bob")
    assert sandbox.looked_up == 0 and sandbox.records == []
    answer = await calls.read_file(CALLER, "missing.txt", {}, user="user")
    assert answer.status == 404
    await answer.aclose()


async def test_another_tenants_sandbox_is_not_found(sandbox: OneSandbox) -> None:
    with pytest.raises(SandboxNotFound):
        await SandboxCalls(sandbox).list_contexts(SandboxCaller("other", "key-2", "sbx-1"), {})


async def test_a_write_is_on_the_record_before_its_first_byte_with_its_path_clipped(
    sandbox: OneSandbox,
) -> None:
    """E2B's door (``file_writer``, its uploads) clips the path it records."""
    writer = await SandboxCalls(sandbox).file_writer(CALLER)
    long_path = "d/" * 1500 + "f"
    sending = writer.write(long_path, {}, _body(b"never sent"))
    sending.close()  # nothing sent: the record was made all the same
    [record] = sandbox.records
    assert record.action == "sandbox.write_file"
    path = record.details["path"] if record.details else ""
    assert isinstance(path, str) and len(path) == 2049 and path.endswith("…")


async def test_a_native_write_records_its_whole_path(sandbox: OneSandbox) -> None:
    """The native door (``write_file``) keeps the whole path on the record, as it always has."""
    long_path = "d/" * 1500 + "f"

    class Stop(Exception):
        """The body ends the write before its first byte (the record is all this needs)."""

    async def body() -> AsyncIterator[bytes]:
        assert sandbox.records, "the record is made before the body is read"
        raise Stop
        yield b""  # an async generator

    with pytest.raises(Stop):
        await SandboxCalls(sandbox).write_file(CALLER, long_path, {}, body())
    [record] = sandbox.records
    assert record.action == "sandbox.write_file"
    assert record.details == {"path": long_path}


async def test_a_read_without_a_path_is_refused_after_the_user_and_the_lookup(
    sandbox: OneSandbox,
) -> None:
    calls = SandboxCalls(sandbox)
    with pytest.raises(Forbidden) as refused:
        await calls.read_file(CALLER, None, {}, user="bob")
    assert "a sandbox has the users 'user' and 'root' only" in str(refused.value)
    with pytest.raises(SandboxNotFound):
        await calls.read_file(SandboxCaller("other", "key-2", "sbx-1"), None, {})
    with pytest.raises(InvalidRequest, match="the path query parameter is required"):
        await calls.read_file(CALLER, None, {})
    assert sandbox.looked_up == 2


async def test_a_download_is_inert_and_a_refusal_is_the_native_error(
    sandbox: OneSandbox, daemon: Daemon
) -> None:
    (daemon.home / "page.html").write_text("<script>alert(1)</script>")
    calls = SandboxCalls(sandbox)
    answer = await calls.read_file(CALLER, "page.html", {})
    assert answer.status == 200
    assert await answer.aread() == b"<script>alert(1)</script>"
    assert answer.headers["content-type"] == "application/octet-stream"
    assert answer.headers["content-disposition"] == "attachment"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["Ringfence-Origin"] == "sandbox"
    missing = await calls.read_file(CALLER, "missing.txt", {})
    status, code, message = await missing.refusal()
    assert (status, code) == (404, "not_found") and message


async def _archive_of(calls: SandboxCalls, path: str) -> tuple[bytes, bool]:
    answer = await calls.read_archive(CALLER, path, {})
    assert answer.status == 200
    data = b"".join([chunk async for chunk in answer.stream()])
    return data, answer.cut


@pytest.mark.parametrize("configured", [True, False], ids=["setting", "from-disk-limit"])
async def test_an_archive_is_cut_at_its_bound_however_large_its_files_claim_to_be(
    sandbox: OneSandbox,
    daemon: Daemon,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    configured: bool,
) -> None:
    """A sparse file (or one hard-linked many times) costs the disk nothing and the archive
    its whole apparent size: the stream stops at the bound, without tar's end marker, and
    the SDK's extractor refuses what arrived."""
    from ringfence.client._untar import extract_archive

    tree = daemon.home / f"inflated-{configured}"
    tree.mkdir()
    with open(tree / "sparse", "wb") as f:
        f.truncate(1 << 40)  # 1 TiB apparent, nothing allocated
    for n in range(3):
        os.link(tree / "sparse", tree / f"hard-{n}")
    bound = 3 << 20
    if configured:
        calls = SandboxCalls(sandbox, archive_max_bytes=bound)
    else:  # 4 x the 1 MiB disk limit OneSandbox.get reports, plus the slack
        monkeypatch.setattr(sandbox_calls, "ARCHIVE_SLACK_BYTES", bound - 4 * (1 << 20))
        calls = SandboxCalls(sandbox)
        bound = sandbox_calls.archive_limit(ResourceLimits(disk=1 << 20))
    data, cut = await _archive_of(calls, tree.name)
    assert cut and len(data) == bound
    (tmp_path / "cut.tar").write_bytes(data)
    (tmp_path / "out").mkdir()
    with pytest.raises(SandboxError, match=r"sound tar|cut short|more than"):
        extract_archive(tmp_path / "cut.tar", tmp_path / "out")


async def test_an_archive_under_its_bound_is_whole(sandbox: OneSandbox, daemon: Daemon) -> None:
    (daemon.home / "small").mkdir()
    (daemon.home / "small" / "f").write_bytes(b"x" * 5000)
    data, cut = await _archive_of(SandboxCalls(sandbox, archive_max_bytes=1 << 20), "small")
    assert not cut and data.endswith(bytes(1024))
