"""A client's mistake is a 4xx naming the field, never a 500 or a sandbox that cannot work.

Bounds measured on real sandboxes: below them the sandbox's daemon could not start, a first
command or code cell failed, or bubblewrap refused its arguments.
"""

from __future__ import annotations

import pytest

from ringfence.models import MIN_SANDBOX_MEMORY, MIN_SANDBOX_PIDS, Role
from ringfence.service.keys import mint_key
from tests.server._envd import run
from tests.server.conftest import Api

pytestmark = pytest.mark.integration

_TOO_MANY_VARIABLES = {f"V{i}": "x" for i in range(100_000)}


@pytest.mark.fakes  # a refusal: logic
@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"limits": {"pids": 1}}, "limits.pids"),
        ({"limits": {"pids": 2}}, "limits.pids"),
        ({"limits": {"memory": "4M"}}, "limits.memory"),
        ({"limits": {"cpus": 5e-324}}, "limits.cpus"),
        ({"env": _TOO_MANY_VARIABLES}, "env"),
        ({"env": {"A": "x" * (40 << 10)}}, "env.A"),
        ({"env": {f"V{i}": "x" * (30 << 10) for i in range(10)}}, "env"),
        ({"timeout": 5e-324}, "timeout"),
    ],
)
async def test_a_sandbox_that_could_not_work_is_refused_naming_the_field(
    live: Api, spec: dict[str, object], field: str
) -> None:
    response = await live.client.post("/v1/sandboxes", headers=live.acme, json=spec)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(field), error["message"]


@pytest.mark.fakes  # a refusal: logic
@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"limits": {"pids": 1}}, "limits.pids"),
        ({"limits": {"cpus": 1e-9}}, "limits.cpus"),
        ({"env": _TOO_MANY_VARIABLES}, "env"),
        ({"args": ["x"] * 5000}, "args"),
        ({"args": ["x" * 100_000] * 6}, "command and args"),
        ({"command": ["", "x"]}, "command"),
    ],
)
async def test_an_execution_that_could_not_start_is_refused_naming_the_field(
    live: Api, request_: dict[str, object], field: str
) -> None:
    body = {"command": ["true"], **request_}
    response = await live.client.post("/v1/executions", headers=live.acme, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert field in error["message"], error["message"]


async def test_a_sandbox_at_the_floors_runs_commands_and_code(live: Api) -> None:
    limits = {"memory": MIN_SANDBOX_MEMORY, "pids": MIN_SANDBOX_PIDS, "cpus": 0.01}
    env = {f"V{i}": "x" for i in range(1000)}
    created = await live.client.post(
        "/v1/sandboxes", headers=live.acme, json={"limits": limits, "env": env}
    )
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    ran = await run(live.client, live.acme, sandbox_id, ["sh", "-c", "echo $V999 | cat | wc -c"])
    assert ran.stdout.strip() == "2" and ran.end["exitCode"] == 0
    cell = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/code/execute",
        headers=live.acme,
        json={"code": "sum(i * i for i in range(1000))"},
    )
    assert cell.status_code == 200 and "332833500" in cell.text, cell.text


@pytest.mark.every_store
async def test_audit_paging_past_the_stores_integers_is_a_4xx(live: Api) -> None:
    admin = {"Authorization": f"Bearer {await mint_key(live.store, 'acme', Role.ADMIN)}"}
    for after in (1 << 63, 10**30):
        response = await live.client.get("/v1/audit", headers=admin, params={"after": after})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_request"
    last = await live.client.get("/v1/audit", headers=admin, params={"after": (1 << 63) - 1})
    assert last.status_code == 200 and last.json() == []
