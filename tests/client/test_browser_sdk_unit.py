"""The SDK's browser door without a server: what it sends (checked first), how long it
waits, what it reads back (a screenshot as PNG bytes), and the CDP endpoint it names."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

from ringfence.client import AsyncRingfence, AsyncSandbox, CdpEndpoint, SandboxInfo, decode_png
from ringfence.client._browser import cdp_endpoint, scrape_request, scrape_seconds
from ringfence.errors import (
    BrowserActionFailed,
    BrowserError,
    BrowserTimeout,
    BrowserUnavailable,
    InvalidRequest,
    SandboxError,
    error_for,
)
from ringfence.models.browser import ClickAction, ScrapeResult
from tests.client.conftest import mock_link

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
RESULT = {
    "markdown": "# Hello",
    "screenshot": base64.b64encode(PNG).decode(),
    "metadata": {"url": "http://site.test/", "status_code": 200},
    "firewall": {"rules": ["hidden"], "removed": {"hidden": 2}, "removed_chars": 40},
}


def test_a_request_takes_actions_as_models_or_dicts_and_enums_or_strings() -> None:
    request = scrape_request(
        "http://site.test/", formats=["markdown", "screenshot@full_page"],
        actions=[{"type": "write", "text": "alice"}, ClickAction(selector="#go")],
        firewall=["hidden"], cookies=[{"name": "s", "value": "1"}],
    )  # fmt: skip
    assert [a.type for a in request.actions] == ["write", "click"]
    assert [f.value for f in request.formats] == ["markdown", "screenshot@full_page"]
    assert [r.value for r in request.firewall] == ["hidden"]
    assert len(scrape_request(None).firewall) == 6, "every rule by default"
    assert scrape_request(None, firewall=[]).firewall == []


@pytest.mark.parametrize(
    "fields",
    [
        {"url": "file:///etc/passwd"},
        {"url": "http://a.test/", "formats": ["pdf"]},
        {"url": "http://a.test/", "actions": [{"type": "click"}]},
        {"url": "http://a.test/", "actions": [{"type": "teleport"}]},
        {"url": "http://a.test/", "actions": [{"type": "wait"}]},  # neither ms nor selector
        {"url": "http://a.test/", "firewall": ["everything"]},
        {"url": "http://a.test/", "headers": {"X-A": "1\r\nX-B: 2"}},
        {"url": "http://a.test/", "timeout": 10},
    ],
)
def test_bad_input_is_refused_before_anything_is_sent(fields: dict[str, Any]) -> None:
    url = fields.pop("url")
    with pytest.raises(InvalidRequest) as caught:
        scrape_request(url, **fields)
    assert caught.value.code == "invalid_request"


def test_the_http_call_outlasts_the_scrapes_own_timeout() -> None:
    for timeout in (1000, 30_000, 300_000):
        assert scrape_seconds(scrape_request(None, timeout=timeout)) > timeout / 1000


def test_a_screenshot_decodes_to_png_bytes_and_a_missing_one_says_so() -> None:
    result = ScrapeResult.model_validate(RESULT)
    assert decode_png(result) == PNG
    assert decode_png(RESULT["screenshot"]) == PNG
    with pytest.raises(InvalidRequest):
        decode_png(result.model_copy(update={"screenshot": None}))
    with pytest.raises(SandboxError):
        decode_png(base64.b64encode(b"GIF89a").decode())
    with pytest.raises(SandboxError):
        decode_png("not base64!")


def test_the_cdp_endpoint_is_a_websocket_url_with_the_key_in_its_headers() -> None:
    plain = cdp_endpoint("http://127.0.0.1:8080/", "sbx-1", {"Authorization": "Bearer k"})
    assert plain.url == "ws://127.0.0.1:8080/v1/sandboxes/sbx-1/browser/cdp"
    assert plain.headers == {"Authorization": "Bearer k"}
    assert "Bearer" not in repr(plain) and str(plain) == plain.url
    behind = cdp_endpoint("https://rf.example/api", "a/b", {})
    assert behind.url == "wss://rf.example/api/v1/sandboxes/a%2Fb/browser/cdp"


def _sandbox(handler: Any) -> AsyncSandbox:
    record = {"id": "sbx", "state": "running", "template": "browser", "limits": {}}
    info = SandboxInfo.model_validate(
        {**record, "created_at": "2026-01-01T00:00:00Z", "expires_at": None}
    )
    return AsyncSandbox(info, mock_link(handler))


async def test_a_sandbox_scrape_posts_the_request_and_reads_the_result() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=RESULT)

    sbx = _sandbox(handler)
    result = await sbx.browser.scrape("http://site.test/", timeout=200_000)
    assert result.markdown == "# Hello" and result.firewall.removed == {"hidden": 2}
    (sent,) = seen
    assert sent.method == "POST" and sent.url.path == "/v1/sandboxes/sbx/browser/scrape"
    body = json.loads(sent.content)
    assert body["url"] == "http://site.test/" and body["timeout"] == 200_000
    assert sent.extensions["timeout"]["read"] > 200, "the client waits past the scrape"
    cdp = sbx.browser.cdp_url()
    assert isinstance(cdp, CdpEndpoint) and cdp.url.endswith("/v1/sandboxes/sbx/browser/cdp")
    await sbx.aclose()


async def test_status_and_close_read_the_browsers_state() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/sandboxes/sbx/browser"
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(200, json={"running": True, "url": "http://site.test/"})

    sbx = _sandbox(handler)
    assert (await sbx.browser.status()).url == "http://site.test/"
    assert (await sbx.browser.close()).running is False
    await sbx.aclose()


async def test_a_one_shot_scrape_posts_to_the_servers_pool_and_maps_its_errors() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if json.loads(request.content).get("actions"):
            return httpx.Response(
                429, json={"error": {"code": "too_many_requests", "message": "no room"}}
            )
        return httpx.Response(200, json=RESULT)

    async with AsyncRingfence(
        "http://rf.test", "key", timeout=5, transport=httpx.MockTransport(handler)
    ) as rf:
        result = await rf.browser.scrape("http://site.test/", timeout=60_000)
        assert decode_png(result) == PNG
        assert seen[0].url.path == "/v1/browser/scrape"
        assert seen[0].extensions["timeout"]["read"] > 60, "past the client's own 5 s"
        with pytest.raises(type(error_for("too_many_requests", ""))):
            await rf.browser.scrape("http://site.test/", actions=[{"type": "scrape"}])
        with pytest.raises(InvalidRequest):
            await rf.browser.scrape("javascript:alert(1)")
    assert len(seen) == 2, "the bad URL was never sent"


@pytest.mark.parametrize(
    ("status", "code", "raised"),
    [
        (400, "browser_action_failed", BrowserActionFailed),
        (504, "browser_timeout", BrowserTimeout),
        (503, "browser_unavailable", BrowserUnavailable),
        (502, "browser_failed", BrowserError),
    ],
)
async def test_the_browsers_failures_come_back_as_their_own_exceptions(
    status: int, code: str, raised: type[BrowserError]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": {"code": code, "message": "action 0"}})

    sbx = _sandbox(handler)
    with pytest.raises(raised) as caught:
        await sbx.browser.scrape("http://site.test/")
    assert caught.value.code == code and isinstance(caught.value, BrowserError)
    await sbx.aclose()
