"""A tenant never reads the server's host paths (the templates directory, the data and
runtime directories) in an answer: the operator's layout is not the tenant's business, and
a path is a step towards an attack on it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from ringfence.config import Config
from ringfence.models import (
    ExecutionRequest,
    ExecutionResult,
    NetworkPolicy,
    ResourceLimits,
    Sandbox,
    SandboxState,
    Status,
)
from ringfence.server.errors import HostPaths
from tests.server.conftest import Api

pytestmark = pytest.mark.fakes  # logic: see tests/README.md, "Which backend"

in_memory = pytest.mark.parametrize("store", ["memory"], indirect=True)


@pytest.fixture
def templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A templates directory of the server's own (before ``api`` reads its settings), with
    one template that is unusable: its root filesystem is writable by everybody."""
    root = tmp_path / "host-templates"
    rootfs = root / "broken" / "rootfs"
    rootfs.mkdir(parents=True)
    (root / "broken" / "template.json").write_text("{}")
    rootfs.chmod(0o777)
    monkeypatch.setenv("RINGFENCE_TEMPLATES_DIR", str(root))
    return root


@in_memory
async def test_template_errors_name_no_host_path(templates: Path, api: Api) -> None:
    for template, status, code in (
        ("nope", 400, "invalid_request"),  # a bad field of the create
        ("broken", 500, "sandbox_error"),
    ):
        response = await api.client.post(
            "/v1/sandboxes", headers=api.acme, json={"template": template}
        )
        error = response.json()["error"]
        assert (response.status_code, error["code"]) == (status, code), response.text
        assert template in error["message"] and "<templates>" in error["message"], error
        assert str(templates) not in response.text and "host-templates" not in response.text


@in_memory
async def test_why_a_sandbox_or_an_execution_failed_names_no_host_path(
    templates: Path, api: Api
) -> None:
    """What a backend said of a failure (stored as it was, for the operator) is shown to the
    tenant without the server's directories."""
    why = f"bwrap: Can't find source path {templates}/broken/rootfs/usr: Permission denied"
    failed = Sandbox(
        id="sb-planted", template="broken", state=SandboxState.FAILED,
        limits=ResourceLimits(), network=NetworkPolicy(), created_at=datetime.now(UTC),
        expires_at=None, ended_at=datetime.now(UTC), error=why,
    )  # fmt: skip
    await api.store.add_sandbox("acme", failed)
    got = await api.client.get("/v1/sandboxes/sb-planted", headers=api.acme)
    listed = await api.client.get("/v1/sandboxes", headers=api.acme)
    killed = await api.client.delete("/v1/sandboxes/sb-planted", headers=api.acme)
    request = ExecutionRequest(id="planted", command=["true"])
    result = ExecutionResult(execution_id="planted", status=Status.FAILED, error=why)
    await api.store.add_execution("acme", request, result)
    execution = await api.client.get("/v1/executions/planted", headers=api.acme)
    executions = await api.client.get("/v1/executions", headers=api.acme)
    for answer in (got, listed, killed, execution, executions):
        assert answer.status_code == 200, answer.text
        assert "<templates>/broken/rootfs/usr" in answer.text, answer.text
        assert str(templates) not in answer.text


def test_host_paths_are_redacted_where_they_are_named() -> None:
    config = Config(
        data_dir=Path("/srv/rf/data"),
        templates_dir=Path("/srv/rf/templates"),
        runtime_dir=Path("/run/rf"),
    )
    paths = HostPaths.of(config)
    assert paths.redact("no template in /srv/rf/templates (known: a)") == (
        "no template in <templates> (known: a)"
    )
    assert paths.redact("'/srv/rf/templates/x/rootfs' is writable") == (
        "'<templates>/x/rootfs' is writable"
    )
    assert paths.redact("cannot create /run/rf/sockets/sb-1.sock: EACCES") == (
        "cannot create <runtime>/sockets/sb-1.sock: EACCES"
    )
    assert paths.redact("database /srv/rf/data/ringfence.db is locked") == (
        "database <data>/ringfence.db is locked"
    )
    # A sandbox's own paths, and a neighbour that only starts alike, are the tenant's.
    for kept in ("open /home/user/x: No such file", "/srv/rf/templates-old is not ours"):
        assert paths.redact(kept) == kept
