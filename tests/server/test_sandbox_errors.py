"""Errors answered from inside a sandbox (files, processes, code contexts) come out of the
native API as every other error does: ``{"error": {"code", "message"}}`` with a status that
the OpenAPI document lists for that route. The daemon's own shapes (Connect's
``{"code": "not_found"}``, envd's ``{"code": 404}``) and statuses (501...) never pass."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from ringfence.service.sandbox_answers import sandbox_error
from tests.server.conftest import Api

in_memory = pytest.mark.parametrize("store", ["memory"], indirect=True)

_TEMPLATE = "/v1/sandboxes/{sandbox_id}"


def _documented(doc: dict[str, Any], method: str, path: str) -> set[int]:
    return {int(status) for status in doc["paths"][_TEMPLATE + path][method]["responses"]}


def _the_documented_error(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert response.headers["content-type"] == "application/json"
    code: str = body["error"]["code"]
    return code


@in_memory
async def test_the_daemons_errors_have_the_documented_shape_and_status(api: Api) -> None:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json={})
    sandbox_id = created.json()["id"]
    base = f"/v1/sandboxes/{sandbox_id}"
    doc = (await api.client.get("/openapi.json")).json()
    rpc = "/rpc/{service}/{method}"
    cases: list[tuple[str, str, str, dict[str, Any], int, str]] = [
        ("get", "/files", "/files", {"params": {"path": "missing.txt"}}, 404, "not_found"),
        ("get", "/files", "/files", {"params": {"path": "/home/user"}}, 400, "invalid_request"),
        ("put", "/files", "/files", {"params": {"path": "/usr/x"}, "content": b"x"}, 400,
         "invalid_request"),
        ("put", "/files", "/files", {"params": {"path": "/home/user"}, "content": b"x"}, 400,
         "invalid_request"),
        ("post", "/rpc/filesystem.Filesystem/Stat", rpc, {"json": {"path": "missing"}}, 404,
         "not_found"),
        ("post", "/rpc/filesystem.Filesystem/ListDir", rpc, {"json": {"path": "/etc/hostname"}},
         400, "invalid_request"),
        ("post", "/rpc/filesystem.Filesystem/Stat", rpc,
         {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400,
         "invalid_request"),
        ("post", "/rpc/process.Process/Nope", rpc, {"json": {}}, 400, "invalid_request"),
        ("post", "/rpc/process.Process/SendSignal", rpc,
         {"json": {"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}}, 404, "not_found"),
        ("post", "/code/execute", "/code/execute", {"json": {"code": "1", "context_id": "nope"}},
         404, "not_found"),
        ("post", "/code/execute", "/code/execute", {"json": {"code": 1}}, 400, "invalid_request"),
        ("post", "/code/contexts", "/code/contexts", {"json": {"language": "cobol"}}, 400,
         "invalid_request"),
        ("delete", "/code/contexts/nope", "/code/contexts/{context_id}", {}, 404, "not_found"),
        ("post", "/code/contexts/nope/restart", "/code/contexts/{context_id}/restart", {}, 404,
         "not_found"),
    ]  # fmt: skip
    for method, suffix, template, options, status, code in cases:
        headers = {**api.acme, **options.pop("headers", {})}
        response = await api.client.request(method, base + suffix, headers=headers, **options)
        where = f"{method.upper()} {suffix}: {response.status_code} {response.text}"
        assert (response.status_code, _the_documented_error(response)) == (status, code), where
        assert response.status_code in _documented(doc, method, template), where
        # Still the sandbox's word, which the SDK must not take for the server's own.
        assert response.headers["ringfence-origin"] == "sandbox", where


@in_memory
async def test_every_native_operation_documents_its_error_statuses(api: Api) -> None:
    doc = (await api.client.get("/openapi.json")).json()
    for path, operations in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            # "default": what a preview URL passes through, the sandbox's own answer.
            statuses = {int(status) for status in operation["responses"] if status != "default"}
            where = f"{method.upper()} {path}"
            assert 422 not in statuses, f"{where}: validation errors are 400s"
            # A preview URL streams its body to the sandbox, and the CDP routes are a
            # WebSocket and its version: ASGI layers in front of the API, whose body limit
            # (413) is not applied there (docs/ports.md, routes/browser_cdp.py).
            in_front = "/ports/{port}" in path or "/browser/cdp" in path
            limited = {500} if in_front else {413, 500}
            assert limited <= statuses, where
            if operation.get("security"):
                assert {401, 503} <= statuses, where
            for status in statuses - {101, 200, 201, 202, 204}:  # 101: a WebSocket opened
                content = operation["responses"][str(status)].get("content", {})
                schema = content.get("application/json", {}).get("schema", {})
                assert schema.get("$ref", "").endswith("/ErrorBody"), f"{where} {status}"


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (501, b'{"code": "unimplemented", "message": "no"}'),
        (418, b'{"code": 418, "message": "teapot"}'),
        (500, b'{"code": "internal", "message": "boom"}'),
        (302, b""),
        (299, b"{}"),
        (404, b"not json at all"),
        (401, b'{"code": "unauthenticated", "message": "forged"}'),
        (400, b'{"error": {"code": "unauthenticated", "message": "forged"}}'),
        (421, b'{"code": "sandbox_on_another_replica", "message": "forged"}'),
        (404, json.dumps({"code": "not_found", "message": "x" * 100_000}).encode()),
        (507, b'{"code": 507, "message": "disk full"}'),
    ],
)
def test_a_hostile_daemon_cannot_choose_the_servers_status_or_code(
    status: int, body: bytes
) -> None:
    """The daemon runs as the sandbox's user and may answer anything: what reaches the
    client is one of a few documented statuses and codes, never one of the server's own
    codes about keys, tenants or replicas."""
    answered, code, message = sandbox_error(status, body)
    assert (answered, code) in {
        (400, "invalid_request"),
        (404, "not_found"),
        (429, "resource_exhausted"),
        (502, "sandbox_error"),
        (507, "resource_exhausted"),
    }, (answered, code, message)
    assert len(message) <= 2100 and message
    if status in (501, 418, 500, 302, 299, 401, 421):
        assert (answered, code) in {(400, "invalid_request"), (502, "sandbox_error")}
