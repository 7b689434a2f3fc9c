"""What an approver sees before approving, over real HTTP on a real server: every field the
digest covers (a walk over the digested request finds each one on the page, so a new field
cannot be silently hidden), credentials by header name only, multi-line scripts with their
line breaks, people by their keys' names, "expires in", where it runs, a warning when this
server cannot reach the cluster the proposal names, and which rule set the risk. Headless
Chromium shows the same page as a person would read it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser

from ringfence.audit.signing import SealKey
from ringfence.backends.local import LocalExecutor
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import ExecutionRequest, Role
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store.sql import SqlStore
from tests.console.conftest import chromium, csrf_of, sign_in
from tests.server.conftest import _uvicorn, sqlite_database

__all__ = ["chromium", "sqlite_database"]

SECRET = "Bearer s3cr3t-token-never-shown"
SCRIPT = "set -e\necho first line\n\techo indented second"
POLICY = """
@id("rm-is-high")
permit (principal, action == Ringfence::Action::"high_risk", resource)
when { context.argv.contains("rm") };
"""
# Every field of an execution request set to a value of its own, so that each can be found.
EVERYTHING: dict[str, Any] = {
    "session_id": "session-7f3a",
    "task_id": "task-91c2",
    "namespace": "sandboxes-blue",
    "target_namespace": "payments-prod",
    "image": "/srv/images/ops-tools",
    "command": ["sh", "-c", SCRIPT],
    "args": ["argument-one", "rm"],
    "env": {"MODE": "drain", "BASH_ENV": "/workspace/hook.sh"},
    "cwd": "/workspace/repo",
    "timeout": 42.5,
    "remediation_action": "drain-node",
    "limits": {"memory": 300 << 20, "pids": 77, "cpus": 0.75, "disk": 123 << 20},
    "mounts": [
        {"source": "/srv/runbooks", "target": "/mnt/runbooks"},
        {"source": "/srv/scratch", "target": "/mnt/scratch", "writable": True},
    ],
    "network": {
        "rules": [
            {"domain": "api.payments.example", "ports": [443, 8443],
             "headers": {"Authorization": SECRET}},
            {"domain": "*.mirror.example", "cidr": "203.0.113.0/24", "action": "ask"},
            {"domain": "evil.example", "action": "deny"},
        ]
    },
}  # fmt: skip
# How a boolean field reads on the page (a new boolean field fails the walk until added).
BOOLEANS = {"writable": {True: "read-write", False: "read-only"}}


@dataclass
class Review:
    url: str
    api: httpx.AsyncClient
    agent: str
    approver: str
    second: str

    async def propose(self, request: dict[str, Any], risk: str = "low") -> dict[str, Any]:
        response = await self.api.post(
            "/v1/proposals",
            headers={"Authorization": f"Bearer {self.agent}"},
            json={"request": request, "rationale": "drain before the upgrade", "risk": risk},
        )
        assert response.status_code == 201, response.text
        proposal: dict[str, Any] = response.json()
        return proposal


@pytest.fixture
async def review(local_host: object, sqlite_database: str, tmp_path: Path) -> AsyncIterator[Review]:
    """A live server on the local backend whose operator lets tenants grant host paths and
    pick images (so a request can set every field), with a risk policy."""
    policy = tmp_path / "risk.cedar"
    policy.write_text(POLICY)
    config = Config(
        pool_sizes={}, allow_tenant_mounts=True, allow_tenant_images=True, risk_policy=policy
    )
    store = await SqlStore.open(sqlite_database)
    services = await build_services(
        config, store=store, executor=LocalExecutor(config, host=local_host),  # type: ignore[arg-type]
        seal_key=SealKey.generate(), seal_interval=3600, credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    keys = [
        await mint_key(store, "acme", Role.AGENT, name="incident-bot"),
        await mint_key(store, "acme", Role.APPROVER, name="Ada Lovelace"),
        await mint_key(store, "acme", Role.APPROVER),  # no name
    ]
    try:
        async with (
            app.router.lifespan_context(app),
            _uvicorn(app) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as api,
        ):
            yield Review(url, api, *keys)
    finally:
        await store.aclose()


class _Fields(HTMLParser):
    """The text of every element with a ``data-field``, by field path, and the page's text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.fields: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []
        self.text = ""
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open.append((tag, dict(attrs).get("data-field")))
        if (path := self._open[-1][1]) is not None:
            self.fields.setdefault(path, "")

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        self.text += data
        for _, path in self._open:
            if path is not None:
                self.fields[path] += data


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a JSON value with its dotted path; an empty list or object is a leaf."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}.{index}")
    else:
        yield path, value


async def _page(review: Review, key: str, path: str) -> str:
    async with httpx.AsyncClient(base_url=review.url, timeout=30) as client:
        assert (await sign_in(client, key)).status_code == 303
        page = await client.get(path)
        assert page.status_code == 200, page.text
        return page.text


async def test_every_field_the_digest_covers_is_on_the_page(review: Review) -> None:
    proposal = await review.propose(EVERYTHING)
    html = await _page(review, review.approver, f"/console/proposals/{proposal['id']}")
    page = _Fields(html)
    # What the digest covers is the stored request as JSON (ringfence.models.proposals).
    digested = ExecutionRequest.model_validate(proposal["request"]).model_dump(mode="json")
    leaves = list(_leaves(digested))
    assert {path.split(".")[0] for path, _ in leaves} == set(ExecutionRequest.model_fields)
    for path, value in leaves:
        assert path in page.fields, f"the request's {path} is not shown"
        shown = page.fields[path]
        name = path.rsplit(".", 1)[-1]
        if ".headers." in f".{path}":
            assert name in shown and "value hidden" in shown, path
        elif isinstance(value, bool):
            assert BOOLEANS[name][value] in shown, path
        elif isinstance(value, str):
            assert value in shown, (path, shown)
        elif isinstance(value, int | float):
            assert str(value) in shown or format(value, "g") in shown, (path, shown)
        else:
            assert value in (None, [], {}), path  # shown as unset or none
    assert SECRET not in html and "s3cr3t" not in html  # credential values never
    # The request's id is the proposal's; checkpoint and approver are the handler's to set.
    assert "set when approved" in page.fields["checkpoint_id"]


async def test_scripts_keep_their_lines_and_people_have_their_names(review: Review) -> None:
    proposal = await review.propose({"command": ["sh", "-c", SCRIPT], "timeout": 30}, "high")
    path = f"/console/proposals/{proposal['id']}"
    page = _Fields(await _page(review, review.approver, path))
    assert page.fields["command.2"] == SCRIPT  # line breaks and tabs kept, nothing added
    assert "incident-bot" in page.text  # the proposer, by its key's name
    assert re.search(r"expires in (59 min|1 h 0 min)", page.text), page.text
    # Approved by a named key, then by one without a name (shown by its id alone).
    for key in (review.approver, review.second):
        async with httpx.AsyncClient(base_url=review.url, timeout=30) as client:
            await sign_in(client, key)
            form = await client.get(path)
            digest = re.search(r'name="digest" value="([0-9a-f]{64})"', form.text)
            assert digest is not None
            posted = await client.post(
                f"{path}/approve", data={"csrf": csrf_of(form.text), "digest": digest.group(1)}
            )
            assert posted.status_code == 303
    for _ in range(600):
        shown = _Fields(await _page(review, review.approver, path))
        if "succeeded" in shown.text:
            break
        await asyncio.sleep(0.05)
    approvals = re.findall(r"Approved by\s*(.*?) at ", shown.text)
    second_id = review.second.split("_")[1]
    assert approvals == ["Ada Lovelace (key " + review.approver.split("_")[1] + ")",
                         f"key {second_id}"], approvals  # fmt: skip


async def test_a_namespace_this_server_cannot_reach_is_said_before_approval(
    review: Review,
) -> None:
    proposal = await review.propose(
        {"command": ["kubectl", "-n", "payments", "rollout", "restart", "deploy/api"],
         "target_namespace": "payments"}
    )  # fmt: skip
    html = await _page(review, review.approver, f"/console/proposals/{proposal['id']}")
    warning = html.find("cannot reach a Kubernetes cluster")
    assert warning != -1, html
    assert warning < html.find('class="approve"')  # before the approve form
    text = _Fields(html).text
    assert "the local backend" in text and "target namespace 'payments'" in text
    plain = await review.propose({"command": ["true"]})
    html = await _page(review, review.approver, f"/console/proposals/{plain['id']}")
    assert "cannot reach a Kubernetes cluster" not in html  # nothing asked of a cluster


async def test_the_page_says_which_rule_set_the_risk(review: Review) -> None:
    raised = await review.propose({"command": ["rm", "-rf", "/workspace/cache"]}, risk="low")
    assert raised["risk"] == "high" and raised["risk_rules"] == ["rm-is-high"]
    text = _Fields(await _page(review, review.approver, f"/console/proposals/{raised['id']}")).text
    assert "high risk" in text and "set by the operator's risk policy (rule rm-is-high)" in text
    own = await review.propose({"command": ["true"]}, risk="high")
    text = _Fields(await _page(review, review.approver, f"/console/proposals/{own['id']}")).text
    assert "high risk" in text and "as the proposer said" in text


async def test_an_approver_reads_the_script_and_the_credentials_in_chromium(
    review: Review, chromium: Browser
) -> None:
    proposal = await review.propose(EVERYTHING)
    context = await chromium.new_context(base_url=review.url)
    page = await context.new_page()
    await page.goto("/console/login")
    await page.fill("#key", review.approver)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{review.url}/console")
    await page.goto(f"/console/proposals/{proposal['id']}")
    script = await page.locator('[data-field="command.2"]').inner_text()
    assert script.splitlines() == SCRIPT.splitlines()  # as lines, on screen
    header = page.locator('[data-field="network.rules.0.headers.Authorization"]')
    assert await header.is_visible() and "value hidden" in await header.inner_text()
    assert SECRET not in await page.content()
    warning = page.locator(".placement-warning")
    assert await warning.is_visible() and "cannot reach" in await warning.inner_text()
    await context.close()
