"""The native API for one-shot executions, in process, on real sandboxes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from ringfence.models import ExecutionRequest, ExecutionResult, Status
from ringfence.service.executions import RESTART_ERROR, ExecutionService
from ringfence.store import MemoryStore
from tests.server.conftest import Api


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


async def test_run_without_waiting_then_poll(api: Api) -> None:
    response = await api.client.post(
        "/v1/executions?wait=false",
        headers=api.acme,
        json={"id": "later", "command": ["sh", "-c", "sleep 0.2; echo done"]},
    )
    assert response.status_code == 202 and response.json()["status"] == "pending"
    body = await _poll(api, "later", api.acme)
    assert body["status"] == "succeeded" and body["logs"] == "done\n"


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


async def test_a_reused_id_is_409(api: Api) -> None:
    body = {"id": "once", "command": ["true"]}
    assert (await api.client.post("/v1/executions", headers=api.acme, json=body)).status_code == 200
    response = await api.client.post("/v1/executions", headers=api.acme, json=body)
    assert response.status_code == 409 and _error(response)["code"] == "duplicate_id"


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
        ({"command": ["true"], "mounts": [{"source": "/no/such", "target": "/d"}]}, "/no/such"),
        ([1, 2], "body"),
    ]
    for body, named in cases:
        response = await api.client.post("/v1/executions", headers=api.acme, json=body)
        assert response.status_code == 400, (body, response.text)
        error = _error(response)
        assert error["code"] == "invalid_request" and named in error["message"], (body, error)
    raw = await api.client.post("/v1/executions", headers=api.acme, content=b"{not json")
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
    } <= set(document["paths"])
    assert "ExecutionRequest" in document["components"]["schemas"]


async def test_executions_cut_off_by_a_restart_are_marked_failed() -> None:
    store = MemoryStore()
    request = ExecutionRequest(id="cut", command=["sleep", "60"])
    await store.add_execution(
        "acme", request, ExecutionResult(execution_id="cut", status=Status.RUNNING)
    )
    service = ExecutionService(store, executor=None)  # type: ignore[arg-type]
    assert await service.reconcile() == 1
    record = await store.get_execution("acme", "cut")
    assert record is not None and record.result.status is Status.FAILED
    assert record.result.error == RESTART_ERROR
