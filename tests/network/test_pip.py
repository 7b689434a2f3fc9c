"""Acceptance: ``pip install six`` inside a sandbox whose policy allows only the package
index this machine reaches (pip's default, pypi.org, with its files on
files.pythonhosted.org: no index URL is configured here), and any other host fails at once.

The only test that leaves this machine, and only to the package index."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ringfence.backends.local import LocalExecutor
from ringfence.config import Config
from ringfence.models import ExecutionRequest, NetworkPolicy, Status
from ringfence.network import EgressGateway, Requester, Resolver, requesting
from ringfence.network.gateway import LISTENING
from ringfence.policy.egress import own_endpoints
from ringfence.service.audit import AuditLog
from tests.network.conftest import audited

INDEX = NetworkPolicy.model_validate(
    {"rules": [{"domain": "pypi.org", "ports": [443]},
               {"domain": "files.pythonhosted.org", "ports": [443]}]}
)  # fmt: skip


@pytest.fixture
async def index_executor(local_host: object) -> AsyncIterator[LocalExecutor]:
    from ringfence.backends.local.probe import Host

    assert isinstance(local_host, Host)
    # The host's resolver, for the index's names only: the policy denies every other name
    # before anything is resolved.
    executor = LocalExecutor(
        Config(), host=local_host, egress=EgressGateway(Resolver(), own=own_endpoints(LISTENING))
    )
    yield executor
    await executor.aclose()


async def test_pip_install_six_through_the_proxy(
    index_executor: LocalExecutor, audit: AuditLog
) -> None:
    script = (
        "python3 -m pip install --no-cache-dir --target /home/user/lib six 2>&1 | tail -1; "
        "PYTHONPATH=/home/user/lib python3 -c 'import six; print(\"six\", six.__version__)'; "
        "python3 -m pip download --no-cache-dir --index-url https://other-index.test/simple "
        '--retries 0 -d /tmp/x six >/dev/null 2>&1; echo "pip $?"; '
        'curl -sS -m 20 https://example.org/ 2>&1; echo "curl $?"'
    )
    request = ExecutionRequest(command=["sh", "-c", script], network=INDEX, timeout=170)
    with requesting(Requester("acme", "execution:pip", "key-1", audit)):
        result = await index_executor.execute(request)
    lines = result.logs.splitlines()
    assert result.status is Status.SUCCEEDED, result.logs
    assert lines[0].startswith("Successfully installed six-"), result.logs
    assert lines[1].startswith("six 1."), result.logs
    assert lines[2] == "pip 1", "another index: refused (pip shows only 'no distribution')"
    assert lines[3:] == ["curl: (56) CONNECT tunnel failed, response 403", "curl 56"]
    records = await audited(audit, "network.connect")
    allowed = {r.details["host"] for r in records if r.outcome == "allowed"}
    denied = {r.details["host"] for r in records if r.outcome == "denied"}
    assert allowed == {"pypi.org", "files.pythonhosted.org"}
    assert denied == {"other-index.test", "example.org"}
    assert all(r.details["bytes_received"] > 0 for r in records if r.outcome == "allowed")
