"""The served OpenAPI document states this server's ceilings beside the models' floors."""

from __future__ import annotations

from typing import Any

from ringfence.audit.signing import SealKey
from ringfence.backends.process import ProcessExecutor
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import MIN_SANDBOX_MEMORY, MIN_SANDBOX_PIDS, ResourceLimits
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.store import MemoryStore


async def _document(config: Config) -> dict[str, Any]:
    services = await build_services(
        config, store=MemoryStore(), executor=ProcessExecutor(config),
        seal_key=SealKey.generate(), credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    document: dict[str, Any] = app.openapi()
    return document


def _number(schema: dict[str, Any]) -> dict[str, Any]:
    branches: list[dict[str, Any]] = schema.get("anyOf", [schema])
    [branch] = [b for b in branches if b.get("type") in ("integer", "number")]
    return branch


async def test_the_document_states_the_servers_ceilings_and_the_floors() -> None:
    ceilings = ResourceLimits(memory="2G", pids=300, cpus=1.5, disk="1G")
    document = await _document(Config(max_limits=ceilings, max_timeout=600))
    schemas = document["components"]["schemas"]
    limits = schemas["SandboxLimits"]["properties"]
    assert _number(limits["memory"]) == {
        "type": "integer", "minimum": MIN_SANDBOX_MEMORY, "maximum": 2 << 30
    }  # fmt: skip
    assert _number(limits["pids"])["minimum"] == MIN_SANDBOX_PIDS
    assert _number(limits["pids"])["maximum"] == 300
    assert _number(limits["cpus"]) == {"type": "number", "minimum": 0.01, "maximum": 1.5}
    assert _number(schemas["ResourceLimits"]["properties"]["disk"])["maximum"] == 1 << 30
    for name in ("SandboxSpec", "ExecutionRequest", "Timeout"):
        assert _number(schemas[name]["properties"]["timeout"])["maximum"] == 600
    request = schemas["ExecutionRequest"]["properties"]
    assert request["mounts"]["maxItems"] == 0  # not allowed here
    assert {"const": "host"} in request["image"]["anyOf"]


async def test_mounts_and_images_are_open_where_the_operator_allows_them() -> None:
    config = Config(allow_tenant_mounts=True, allow_tenant_images=True)
    request = (await _document(config))["components"]["schemas"]["ExecutionRequest"]["properties"]
    assert request["mounts"]["maxItems"] == 64
    assert {"type": "string"} in request["image"]["anyOf"]
