"""The SDK against a real server: the async client in process, the sync twin over loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfence.client import AsyncRingfence, Ringfence
from ringfence.errors import (
    DuplicateExecution,
    ExecutionNotFound,
    InvalidRequest,
    ServerUnreachable,
    Unauthenticated,
)
from ringfence.models import ExecutionRequest, ResourceLimits, Status
from tests.server.conftest import Api
from tests.server.test_serve_process import Server


def _client(api: Api, key: str) -> AsyncRingfence:
    return AsyncRingfence("http://ringfence.test", key, transport=api.transport)


@pytest.mark.every_store
async def test_run_get_list_cancel(api: Api) -> None:
    async with _client(api, api.acme_key) as rf:
        result = await rf.executions.run(
            ["sh", "-c", "echo $GREETING"], env={"GREETING": "hi"}, id="sdk-1",
            limits=ResourceLimits(memory="64M"), timeout=10,
        )  # fmt: skip
        assert (result.status, result.exit_code, result.logs) == (Status.SUCCEEDED, 0, "hi\n")
        assert await rf.executions.get("sdk-1") == result
        pending = await rf.executions.run(["sleep", "30"], id="sdk-2", wait=False)
        assert pending.status is Status.PENDING
        cancelled = await rf.executions.cancel("sdk-2")
        assert cancelled.status is Status.CANCELLED
        listed = await rf.executions.list()
        assert [r.execution_id for r in listed] == ["sdk-2", "sdk-1"]
        assert [r.execution_id for r in await rf.executions.list(status=Status.SUCCEEDED)] == [
            "sdk-1"
        ]
        request = ExecutionRequest(id="sdk-3", command=["true"])
        assert (await rf.executions.run(request)).execution_id == "sdk-3"


@pytest.mark.fakes  # logic
async def test_errors_come_back_as_their_types(api: Api) -> None:
    async with _client(api, api.acme_key) as rf:
        await rf.executions.run(["true"], id="taken")
        with pytest.raises(DuplicateExecution):
            await rf.executions.run(["true"], id="taken")
        with pytest.raises(ExecutionNotFound):
            await rf.executions.get("missing")
        with pytest.raises(InvalidRequest):
            await rf.executions.run(["true"], timeout=-1)  # refused before sending
        with pytest.raises(InvalidRequest) as exc:
            await rf.executions.run(["true"], image="ubuntu")  # refused by the server
        assert exc.value.code == "invalid_request" and "image" in exc.value.message
    async with _client(api, api.globex_key) as other:
        with pytest.raises(ExecutionNotFound):
            await other.executions.get("taken")
    async with _client(api, "rf_0000000000000000_" + "A" * 43) as wrong:
        with pytest.raises(Unauthenticated):
            await wrong.executions.list()


def test_the_sync_client_over_a_live_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(tmp_path / "data", None)
    server.start()
    try:
        monkeypatch.setenv("RINGFENCE_URL", server.url)
        monkeypatch.setenv("RINGFENCE_API_KEY", (server.data_dir / "admin-key").read_text().strip())
        with Ringfence() as rf:  # configured from the environment
            result = rf.executions.run(["python3", "-c", "print(1)"], id="sync-1")
            assert (result.status, result.logs) == (Status.SUCCEEDED, "1\n")
            assert rf.executions.get("sync-1") == result
            assert [r.execution_id for r in rf.executions.list()] == ["sync-1"]
            with pytest.raises(ExecutionNotFound):
                rf.executions.cancel("nope")
    finally:
        server.stop()


def test_an_unreachable_server_and_a_missing_key_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RINGFENCE_API_KEY", raising=False)
    with pytest.raises(InvalidRequest):
        Ringfence("http://127.0.0.1:9")
    with Ringfence("http://127.0.0.1:9", "rf_key") as rf, pytest.raises(ServerUnreachable) as exc:
        rf.executions.list()
    assert exc.value.code == "unreachable" and "127.0.0.1:9" in exc.value.message
