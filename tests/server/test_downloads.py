"""What the sandbox answers can never run as a page of the server's origin (where the
approval console lives): a download is an attachment of opaque bytes, and every answer that
comes from a sandbox is marked nosniff and CSP-sandboxed, whatever type the daemon claims."""

from __future__ import annotations

import pytest

from ringfence.service.sandbox_answers import answer_headers
from tests.server._envd import STREAM, run, start_body
from tests.server.conftest import Api

PAGE = "<html><script>fetch('/console')</script></html>"
HARDENED = {"x-content-type-options": "nosniff", "content-security-policy": "sandbox"}


def _download_headers_of(headers: object) -> dict[str, str]:
    assert hasattr(headers, "get")
    return {
        "content-type": headers.get("content-type"),
        "content-disposition": headers.get("content-disposition"),
        "x-content-type-options": headers.get("x-content-type-options"),
        "content-security-policy": headers.get("content-security-policy"),
    }


DOWNLOAD = {
    "content-type": "application/octet-stream",
    "content-disposition": "attachment",
    **HARDENED,
}


@pytest.mark.fakes  # logic: the answer's headers
async def test_an_html_file_downloads_as_an_inert_attachment(live: Api) -> None:
    created = await live.client.post("/v1/sandboxes", headers=live.acme, json={})
    sandbox_id = created.json()["id"]
    ran = await run(
        live.client, live.acme, sandbox_id, ["sh", "-c", f"printf '%s' \"{PAGE}\" > page.html"]
    )
    assert ran.end["exited"], ran
    read = await live.client.get(
        f"/v1/sandboxes/{sandbox_id}/files", headers=live.acme, params={"path": "page.html"}
    )
    assert read.status_code == 200 and read.text == PAGE
    assert _download_headers_of(read.headers) == DOWNLOAD
    missing = await live.client.get(
        f"/v1/sandboxes/{sandbox_id}/files", headers=live.acme, params={"path": "nope"}
    )
    assert missing.status_code == 404 and missing.headers["ringfence-origin"] == "sandbox"
    assert {k: missing.headers.get(k) for k in HARDENED} == HARDENED
    stat = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/rpc/filesystem.Filesystem/Stat",
        headers=live.acme,
        json={"path": "page.html"},
    )
    assert stat.status_code == 200 and stat.headers["content-type"] == "application/json"
    assert {k: stat.headers.get(k) for k in HARDENED} == HARDENED
    streamed = await live.client.post(
        f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/Start",
        headers={**live.acme, **STREAM},
        content=start_body(["true"]),
    )
    assert {k: streamed.headers.get(k) for k in HARDENED} == HARDENED


def test_a_hostile_daemons_html_is_never_passed_on_as_html() -> None:
    """The daemon runs as the sandbox's user: it may answer anything."""
    hostile = [("Content-Type", "text/html; charset=utf-8"), ("Set-Cookie", "a=b")]
    download = answer_headers(hostile, "42", download=True)
    assert {k.lower(): v for k, v in download.items() if k.lower() != "ringfence-origin"} == {
        **DOWNLOAD,
        "content-length": "42",
    }
    other = {k.lower(): v for k, v in answer_headers(hostile, None, download=False).items()}
    assert other == {**HARDENED, "content-type": "application/octet-stream",
                     "ringfence-origin": "sandbox"}  # fmt: skip
    for kind in ("application/json", "application/connect+json"):
        kept = answer_headers([("content-type", kind)], None, download=False)
        assert kept["content-type"] == kind
