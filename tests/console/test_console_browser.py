"""The console end to end in real headless Chromium (Debian's, driven by Playwright): an
agent proposes over the API, approvers decide in the browser, the action runs once, and the
history, the audit page and the sealed audit chain all show it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page

from ringfence.audit.verify import verify_export
from ringfence.models import AuditQuery
from tests.console.conftest import Console

XSS = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


async def _signed_in(browser: Browser, console: Console, key: str) -> Page:
    """A fresh browser profile, signed in to the console with ``key``."""
    context = await browser.new_context(base_url=console.url)
    page = await context.new_page()
    await page.goto("/console/login")
    await page.fill("#key", key)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{console.url}/console")
    return page


async def _approve(page: Page, proposal_id: str, reason: str) -> str:
    """Approve from the proposal page; the flash message the console answers with."""
    await page.goto(f"/console/proposals/{proposal_id}")
    await page.fill("#approve-reason", reason)
    await page.click("button[value=approve]")
    await page.wait_for_url(f"**/console/proposals/{proposal_id}")
    return (await page.locator("p.flash").inner_text()).strip()


async def _history_card(page: Page, proposal_id: str, state: str) -> Any:
    """The history page's card for the proposal, once it shows ``state`` (bounded wait)."""
    for _ in range(200):
        await page.goto("/console/history")
        card = page.locator("section.history-item").filter(
            has=page.locator(f'a[href="/console/proposals/{proposal_id}"]')
        )
        if await card.count() and await card.locator(".outcome dd .state").first.inner_text() == (
            state
        ):
            return card
        await asyncio.sleep(0.05)
    raise AssertionError(f"the history never showed {proposal_id} as {state}")


async def _audit_trail(page: Page, targets: set[str], last: str) -> list[str]:
    """The actions the audit page lists on ``targets``, once ``last`` is among them."""
    for _ in range(200):
        await page.goto("/console/audit?limit=500")
        actions = await page.locator("tr.record td.action").all_inner_texts()
        on = await page.locator("tr.record td.target").all_inner_texts()
        trail = [a.strip() for a, t in zip(actions, on, strict=True) if t.strip() in targets]
        if last in trail:
            return trail
        await asyncio.sleep(0.05)
    raise AssertionError(f"the audit page never showed {last}")


@pytest.mark.every_store
async def test_an_approver_approves_in_the_browser_and_it_runs_once(
    console: Console, chromium: Browser, tmp_path: Path
) -> None:
    proposal = await console.propose(rationale="the cache filled /var; clear it")
    hostile = await console.propose(rationale=XSS)  # listed on the same page
    page = await _signed_in(chromium, console, console.approver)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))

    card = page.locator("section.card").filter(
        has=page.locator(f'a[href="/console/proposals/{proposal["id"]}"]')
    )
    assert await card.locator("ol.argv li code").all_inner_texts() == [
        "sh", "-c", "echo remediated",
    ]  # fmt: skip
    assert await card.locator("p.shell code").inner_text() == "sh -c 'echo remediated'"
    assert proposal["digest"] in await card.inner_text()
    rationale = page.locator("section.card").filter(
        has=page.locator(f'a[href="/console/proposals/{hostile["id"]}"]')
    )
    assert await rationale.locator("pre.text").inner_text() == XSS  # shown as text, inert
    assert await page.locator("img").count() == 0

    await card.locator("a.button").click()
    await page.wait_for_url(f"**/console/proposals/{proposal['id']}")
    assert await page.locator("input[name=digest]").get_attribute("value") == proposal["digest"]
    assert await _approve(page, proposal["id"], "checked: it only clears the cache") == (
        "Approved: it is running now."
    )

    history = await _history_card(page, proposal["id"], "succeeded")
    assert await history.locator("pre.logs").text_content() == "remediated\n"
    assert "exit code 0" in " ".join((await history.locator(".outcome").inner_text()).split())
    assert "checked: it only clears the cache" in await history.inner_text()
    done = await console.finished(proposal["id"])
    assert done["state"] == "succeeded"
    runs = (await console.api.client.get("/v1/executions", headers=console.api.acme)).json()
    assert [run["execution_id"] for run in runs] == [proposal["request"]["id"]], "ran once"

    trail = await _audit_trail(
        page,
        {f"proposal:{proposal['id']}", f"execution:{proposal['request']['id']}"},
        "proposal.executed",
    )
    assert trail == [
        "proposal.create",
        "proposal.approve",
        "execution.submit",
        "execution.start",
        "execution.end",
        "proposal.executed",
    ], trail
    assert dialogs == [], "no script ran in the console"

    # The whole chain, sealed, verifies offline: in process and with the operator's CLI.
    audit = console.api.services.audit
    await audit.seal()
    records = await console.api.store.list_audit(AuditQuery(limit=1_000_000))
    lines = [record.line() for record in records]
    verdict = verify_export(lines, public_key=audit.public_key)
    assert verdict.ok and verdict.records == len(records), verdict.problem
    assert {"proposal.approve", "proposal.executed", "console.login"} <= {r.action for r in records}
    export = tmp_path / "audit.jsonl"
    export.write_text("".join(line + "\n" for line in lines))
    cli = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("ringfence")), "audit", "verify", str(export),
        "--public-key", audit.public_key,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await cli.communicate()
    assert cli.returncode == 0, output.decode()


async def test_the_proposer_is_refused_and_high_risk_needs_two_approvers(
    console: Console, chromium: Browser
) -> None:
    own = await console.propose(
        headers={"Authorization": f"Bearer {console.approver}"}, rationale="mine"
    )
    risky = await console.propose(risk="high", rationale="restart the database")
    first = await _signed_in(chromium, console, console.approver)

    await first.goto(f"/console/proposals/{own['id']}")
    assert "You proposed this" in await first.locator("main").inner_text()
    refusal = await _approve(first, own["id"], "looks fine to me")
    assert refusal == "Not approved: a proposer cannot approve their own proposal"
    assert (await console.proposal(own["id"]))["approvals"] == []

    once = await _approve(first, risky["id"], "first of two")
    assert once == "Approved (1 of 2): it waits for another approver."
    pending = await console.proposal(risky["id"])
    assert pending["state"] == "pending" and len(pending["approvals"]) == 1
    again = await _approve(first, risky["id"], "me again")
    assert again.startswith("Not approved: you already approved this proposal")
    await first.goto("/console")
    assert await first.locator(f'a[href="/console/proposals/{risky["id"]}"]').count() > 0

    second = await _signed_in(chromium, console, console.second_approver)
    assert await _approve(second, risky["id"], "second of two") == "Approved: it is running now."
    history = await _history_card(second, risky["id"], "succeeded")
    assert await history.locator("pre.logs").text_content() == "remediated\n"
    assert "first of two" in await history.inner_text()
    assert "second of two" in await history.inner_text()
    runs = (await console.api.client.get("/v1/executions", headers=console.api.acme)).json()
    assert [run["execution_id"] for run in runs] == [risky["request"]["id"]]
    assert (await console.proposal(own["id"]))["state"] == "pending"
