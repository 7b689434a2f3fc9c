"""The native API for one-shot executions, in process, on real sandboxes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from ringfence.config import Config
from ringfence.models import ExecutionRequest, ExecutionResult, Status
from ringfence.service.budget import Budget
from ringfence.service.executions import RESTART_ERROR, ExecutionService
from ringfence.store import MemoryStore
from tests.server.conftest import Api

pytestmark = pytest.mark.fakes  # logic: see tests/README.md, "Which backend"


def _error(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return body["error"]  # type: ignore[no-any-return]


async def _poll(api: Api, execution_id: str, headers: dict[str, str]) -> dict[str, Any]:
    for _ in range(500):
        body: dict[str, Any] = (
            await api.client.get(f"/v1/executions/{execution_id}", headers=headers)
        ).json()
        if Status(body["status"]).is_terminal:
            return body
        await asyncio.sleep(0.01)
    raise AssertionError("the execution never ended")


async def test_health_needs_no_key(api: Api) -> None:
    response = await api.client.get("/v1/health")
    assert response.status_code == 200 and response.json()["status"] == "ok"


async def test_keys_identify_their_tenant(api: Api) -> None:
    response = await api.client.get("/v1/whoami", headers=api.acme)
    assert response.json()["tenant"] == "acme" and response.json()["role"] == "agent"
    assert (await api.client.get("/v1/whoami", headers=api.globex)).json()["tenant"] == "globex"


async def test_a_missing_or_wrong_key_is_401_json(api: Api) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer nonsense"},
        {"X-API-Key": "rf_0123456789abcdef_" + "A" * 43},
        {"Authorization": api.acme["Authorization"][:-2] + "xx"},
    ):
        response = await api.client.get("/v1/whoami", headers=headers)
        assert response.status_code == 401, headers
        assert _error(response)["code"] == "unauthenticated"


@pytest.mark.every_store
async def test_run_and_wait(api: Api) -> None:
    response = await api.client.post(
        "/v1/executions",
        headers=api.acme,
        json={"id": "hello", "command": ["sh", "-c", "echo hi; exit 3"]},
    )
    assert response.status_code == 200
    result = ExecutionResult.model_validate(response.json())
    assert (result.execution_id, result.status, result.exit_code, result.logs) == (
        "hello",
        Status.FAILED,
        3,
        "hi\n",
    )
    stored = await api.client.get("/v1/executions/hello", headers=api.acme)
    assert ExecutionResult.model_validate(stored.json()) == result


@pytest.mark.every_store
async def test_run_without_waiting_then_poll(api: Api) -> None:
    response = await api.client.post(
        "/v1/executions?wait=false",
        headers=api.acme,
        json={"id": "later", "command": ["sh", "-c", "sleep 0.2; echo done"]},
    )
    assert response.status_code == 202 and response.json()["status"] == "pending"
    body = await _poll(api, "later", api.acme)
    assert body["status"] == "succeeded" and body["logs"] == "done\n"


@pytest.mark.every_store
async def test_cancel_kills_a_running_execution(api: Api) -> None:
    await api.client.post(
        "/v1/executions?wait=false",
        headers=api.acme,
        json={"id": "long", "command": ["sleep", "60"]},
    )
    for _ in range(500):
        live = (await api.client.get("/v1/executions/long", headers=api.acme)).json()
        if live["status"] == "running":
            break
        await asyncio.sleep(0.01)
    response = await api.client.post("/v1/executions/long/cancel", headers=api.acme)
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    again = await api.client.post("/v1/executions/long/cancel", headers=api.acme)
    assert again.json() == response.json()


@pytest.mark.every_store
async def test_a_running_execution_is_recorded_as_running(api: Api) -> None:
    await api.client.post("/v1/executions?wait=false", headers=api.acme,
                          json={"id": "busy", "command": ["sleep", "60"]})  # fmt: skip
    for _ in range(500):
        record = await api.store.get_execution("acme", "busy")
        if record is not None and record.result.status is Status.RUNNING:
            break
        await asyncio.sleep(0.01)
    assert record is not None and record.result.status is Status.RUNNING
    assert record.result.started_at is not None
    listed = (await api.client.get("/v1/executions?status=running", headers=api.acme)).json()
    assert [r["execution_id"] for r in listed] == ["busy"]
    await api.client.post("/v1/executions/busy/cancel", headers=api.acme)
    final = await api.store.get_execution("acme", "busy")
    assert final is not None and final.result.status is Status.CANCELLED, "not overwritten"


@pytest.mark.every_store
async def test_another_tenant_sees_nothing_and_gets_404(api: Api) -> None:
    await api.client.post(
        "/v1/executions", headers=api.acme, json={"id": "secret-job", "command": ["true"]}
    )
    for method, path in (
        ("GET", "/v1/executions/secret-job"),
        ("POST", "/v1/executions/secret-job/cancel"),
    ):
        response = await api.client.request(method, path, headers=api.globex)
        assert response.status_code == 404 and _error(response)["code"] == "not_found"
    listed = (await api.client.get("/v1/executions", headers=api.globex)).json()
    assert listed == []
    # The id is the tenant's own: globex may use it too, without a conflict.
    response = await api.client.post(
        "/v1/executions", headers=api.globex, json={"id": "secret-job", "command": ["true"]}
    )
    assert response.status_code == 200


@pytest.mark.every_store
async def test_a_reused_id_is_409(api: Api) -> None:
    body = {"id": "once", "command": ["true"]}
    assert (await api.client.post("/v1/executions", headers=api.acme, json=body)).status_code == 200
    response = await api.client.post("/v1/executions", headers=api.acme, json=body)
    assert response.status_code == 409 and _error(response)["code"] == "duplicate_id"


@pytest.mark.every_store
async def test_listing_filters_by_status(api: Api) -> None:
    for i, command in enumerate((["true"], ["false"], ["true"])):
        await api.client.post(
            "/v1/executions", headers=api.acme, json={"id": f"l{i}", "command": command}
        )
    everything = (await api.client.get("/v1/executions", headers=api.acme)).json()
    assert [r["execution_id"] for r in everything] == ["l2", "l1", "l0"]
    failed = (await api.client.get("/v1/executions?status=failed", headers=api.acme)).json()
    assert [r["execution_id"] for r in failed] == ["l1"]


async def test_bad_input_is_400_naming_the_problem_never_500(api: Api) -> None:
    cases: list[tuple[Any, str]] = [
        ({}, "command"),
        ({"command": []}, "command"),
        ({"command": ["true"], "timeout": -1}, "timeout"),
        ({"command": ["true"], "comand": ["x"]}, "comand"),
        ({"command": ["true"], "limits": {"memory": "lots"}}, "memory"),
        ({"command": ["true"], "env": {"1X": "y"}}, "env"),
        ({"command": ["true"], "mounts": [{"source": "/etc", "target": "/proc"}]}, "mounts"),
        ({"command": ["true"], "image": "ubuntu:24.04"}, "image"),
        ({"command": ["true"], "limits": {"memory": "99999999999999999999999T"}}, "memory"),
        ({"command": ["true"], "limits": {"disk": "9" * 40}}, "disk"),
        ([1, 2], "body"),
    ]
    for body, named in cases:
        response = await api.client.post("/v1/executions", headers=api.acme, json=body)
        assert response.status_code == 400, (body, response.text)
        error = _error(response)
        assert error["code"] == "invalid_request" and named in error["message"], (body, error)
    for lone_surrogate in (
        b'{"command": ["echo", "\\ud800"]}',
        b'{"command": ["true"], "env": {"A": "\\udfff"}}',
    ):
        response = await api.client.post(
            "/v1/executions", content=lone_surrogate,
            headers={**api.acme, "Content-Type": "application/json"},
        )  # fmt: skip
        assert response.status_code == 400 and "unicode" in _error(response)["message"].lower()
    raw = await api.client.post(
        "/v1/executions", content=b"{not json",
        headers={**api.acme, "Content-Type": "application/json"},
    )  # fmt: skip
    assert raw.status_code == 400 and _error(raw)["code"] == "invalid_request"
    assert (await api.client.get("/v1/executions?limit=0", headers=api.acme)).status_code == 400


async def test_unknown_routes_and_methods_are_json_errors(api: Api) -> None:
    response = await api.client.get("/v1/nothing-here", headers=api.acme)
    assert response.status_code == 404 and _error(response)["code"] == "not_found"
    response = await api.client.delete("/v1/executions", headers=api.acme)
    assert response.status_code == 405 and _error(response)["code"] == "method_not_allowed"


async def test_the_openapi_document_describes_the_api(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    assert {
        "/v1/executions",
        "/v1/executions/{execution_id}",
        "/v1/executions/{execution_id}/cancel",
        "/v1/health",
        "/v1/whoami",
        "/v1/sandboxes",
        "/v1/sandboxes/{sandbox_id}",
        "/v1/sandboxes/{sandbox_id}/timeout",
        "/v1/sandboxes/{sandbox_id}/rpc/{service}/{method}",
        "/v1/sandboxes/{sandbox_id}/files",
    } <= set(document["paths"])
    schemas = document["components"]["schemas"]
    assert {"ExecutionRequest", "SandboxSpec", "Sandbox"} <= set(schemas)
    upload = document["paths"]["/v1/sandboxes/{sandbox_id}/files"]["put"]["requestBody"]
    assert "application/octet-stream" in upload["content"], "streamed bodies are documented"


async def test_executions_cut_off_by_a_restart_are_marked_failed() -> None:
    store = MemoryStore()
    request = ExecutionRequest(id="cut", command=["sleep", "60"])
    await store.add_execution(
        "acme", request, ExecutionResult(execution_id="cut", status=Status.RUNNING)
    )
    service = ExecutionService(store, executor=None, budget=Budget())  # type: ignore[arg-type]
    assert await service.reconcile() == 1
    record = await store.get_execution("acme", "cut")
    assert record is not None and record.result.status is Status.FAILED
    assert record.result.error == RESTART_ERROR


async def test_tenants_cannot_grant_host_paths_or_pick_images(api: Api) -> None:
    # The same answer whether the path exists or not: no probing of the host's files.
    messages = set()
    for source in ("/root/.nope", "/root/.bashrc", "/proc", "/tmp"):
        for writable in (False, True):
            response = await api.client.post(
                "/v1/executions", headers=api.acme,
                json={"command": ["true"],
                      "mounts": [{"source": source, "target": "/d", "writable": writable}]},
            )  # fmt: skip
            assert response.status_code == 400
            messages.add(_error(response)["message"])
    assert len(messages) == 1 and "mounts" in messages.pop()
    for image in ("/", "/nonexistent", "/var/lib"):
        response = await api.client.post(
            "/v1/executions", headers=api.acme, json={"command": ["true"], "image": image}
        )
        assert response.status_code == 400 and "image" in _error(response)["message"]


async def test_limits_above_the_servers_ceilings_are_refused(api: Api) -> None:
    for limits, named in (
        ({"memory": "64G"}, "limits.memory"),
        ({"pids": 100000}, "limits.pids"),
        ({"cpus": 512}, "limits.cpus"),
    ):
        response = await api.client.post(
            "/v1/executions", headers=api.acme, json={"command": ["true"], "limits": limits}
        )
        assert response.status_code == 400 and named in _error(response)["message"]
    response = await api.client.post(
        "/v1/executions", headers=api.acme, json={"command": ["true"], "timeout": 7 * 24 * 3600}
    )
    assert response.status_code == 400 and "timeout" in _error(response)["message"]


async def test_a_huge_body_is_refused_before_it_is_read(api: Api) -> None:
    body = b'{"command": ["true"], "args": ["' + b"x" * (5 << 20) + b'"]}'
    response = await api.client.post("/v1/executions", content=body)  # no key at all
    assert response.status_code == 413 and _error(response)["code"] == "too_large"

    async def stream() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * (1 << 20)

    response = await api.client.post("/v1/executions", content=stream(), headers=api.acme)
    assert response.status_code == 413 and _error(response)["code"] == "too_large"


async def test_a_cancel_racing_the_submit_is_not_lost(local_host: object) -> None:
    from ringfence.backends.local import LocalExecutor
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)

    recording = asyncio.Event()

    class SlowStore(MemoryStore):
        """Recording takes a while: the cancel arrives in the middle of it."""

        async def add_execution(self, *args: Any, **kwargs: Any) -> Any:
            recording.set()
            await asyncio.sleep(0.2)
            return await super().add_execution(*args, **kwargs)

    store = SlowStore()
    service = ExecutionService(
        store, LocalExecutor(Config(), host=local_host), Config(),
        budget=Budget.for_server(Config()),
    )  # fmt: skip
    request = ExecutionRequest(id="race", command=["sleep", "30"])
    submitted = asyncio.create_task(service.submit("acme", request, wait=True))
    await asyncio.wait_for(recording.wait(), 10)  # the submit is now recording
    cancelled = await service.cancel("acme", "race")
    assert cancelled.status is Status.CANCELLED and (await submitted) == cancelled
    record = await store.get_execution("acme", "race")
    assert record is not None and record.result.status is Status.CANCELLED
    await service.aclose()
