"""An egress ask decided in real headless Chromium: a sandbox's curl waits on its first
connection to a test origin until an approver allows it from the pending page."""

from __future__ import annotations

from playwright.async_api import Browser

from tests.console.conftest import AskConsole


async def test_an_approver_allows_a_destination_in_the_browser(
    ask_console: AskConsole, chromium: Browser
) -> None:
    console = ask_console
    sandbox_id = await console.sandbox(console.agent, "ask.test")
    waiting = console.fetch(console.agent, sandbox_id, "ask.test")
    ask = await console.pending_ask("ask.test")

    context = await chromium.new_context(base_url=console.url)
    page = await context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await page.goto("/console/login")
    await page.fill("#key", console.approver)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{console.url}/console")

    card = page.locator("section.egress-ask").filter(has_text=ask["id"])
    assert await card.locator("code.destination").inner_text() == "ask.test"
    assert f"sandbox:{sandbox_id}" in await card.inner_text()
    assert not waiting.done()
    await card.locator("textarea[name=reason]").first.fill("the docs mirror")
    await card.locator("button[value=approve]").click()
    await page.wait_for_url(f"{console.url}/console")
    flash = (await page.locator("p.flash").inner_text()).strip()
    assert flash == f"Approved: sandbox:{sandbox_id} may reach ask.test:{console.origin.port}."
    assert await waiting == "hello from origin\n"
    assert await page.locator("section.egress-ask").count() == 0, "nothing left pending"

    await page.goto("/console/history")
    decided = page.locator("section.egress-ask").filter(has_text=ask["id"])
    assert "approved" in await decided.locator(".outcome .state").inner_text()
    assert "the docs mirror" in await decided.inner_text()
    assert dialogs == []
    await context.close()
