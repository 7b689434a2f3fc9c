"""Schemathesis against a real ``ringfence serve``'s own OpenAPI document.

Every operation gets requests generated from the document (a fixed number per operation,
derandomized, so a CI run is the same run every time and takes a minute or two); routes on
a sandbox are pointed at a live one so the fuzz reaches its daemon. Whatever it sends, the
server answers no 5xx, only statuses the document lists, and bodies the document describes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")  # the dev extra installs it

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import Case  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.test_serve_process import Server  # noqa: E402

pytestmark = pytest.mark.integration

_EXAMPLES = 12  # per operation: about 400 requests, a minute or two
_CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


class Fuzzed(Server):
    """A server with an admin key, and one sandbox kept alive for the fuzz to reach."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, None)
        self.sandbox_id = ""

    def start(self) -> None:
        # Room for the sandboxes the fuzz creates (they live 300 s or less).
        os.environ["RINGFENCE_MAX_SANDBOXES_PER_TENANT"] = "64"
        try:
            super().start()
        finally:
            del os.environ["RINGFENCE_MAX_SANDBOXES_PER_TENANT"]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {(self.data_dir / 'admin-key').read_text().strip()}"}

    def live_sandbox(self) -> str:
        """A running sandbox's id (a new one when the fuzz ended the last)."""
        if self.sandbox_id:
            known = httpx.get(f"{self.url}/v1/sandboxes/{self.sandbox_id}", headers=self.headers)
            if known.json().get("state") == "running":
                return self.sandbox_id
        created = httpx.post(f"{self.url}/v1/sandboxes", headers=self.headers, json={}, timeout=60)
        assert created.status_code == 201, created.text
        self.sandbox_id = created.json()["id"]
        return self.sandbox_id


@pytest.fixture(scope="module")
def fuzzed(local_host: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    server = Fuzzed(tmp_path_factory.mktemp("fuzzed") / "data")
    server.start()
    yield server
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=60)


@pytest.mark.timeout(600)  # a bound for a loaded machine; about a minute on a quiet one
def test_no_request_gets_a_5xx_or_an_undocumented_answer(fuzzed: Fuzzed) -> None:
    document = schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json")
    failures: list[str] = []
    for result in document.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=_EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Case[Any]) -> None:
            _call(case, fuzzed)

        try:
            fuzz()
        except (Exception, BaseExceptionGroup) as exc:  # each operation's failures, at the end
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}")
    assert not failures, "\n\n".join(failures)


def _not_a_500(ctx: Any, response: Any, case: Case[Any]) -> bool | None:
    assert response.status_code != 500, f"500: {response.text[:500]}"
    return None


def _call(case: Case[Any], fuzzed: Fuzzed) -> None:
    killing = case.method == "DELETE" and case.path == "/v1/sandboxes/{sandbox_id}"
    if "sandbox_id" in (case.path_parameters or {}) and not killing:
        case.path_parameters["sandbox_id"] = fuzzed.live_sandbox()
    checks = _CHECKS
    if "/ports/" in case.path:  # a port nothing listens on is the documented 502, no bug
        checks = [check for check in _CHECKS if check is not schemathesis.checks.not_a_server_error]
    if "/browser" in case.path:  # the sandbox's browser failing is its documented 5xx (the
        # host image's Chromium wrapper cannot start in a sandbox: 502), never a 500
        checks = [_not_a_500] + [
            c for c in _CHECKS if c is not schemathesis.checks.not_a_server_error
        ]
    case.call_and_validate(headers=fuzzed.headers, checks=checks, timeout=60)
