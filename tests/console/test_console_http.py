"""The console over real HTTP with httpx: who may sign in, that every page needs a session,
that forged form posts decide nothing, that agent-written text never becomes HTML, and that
every answer carries the security headers."""

from __future__ import annotations

import html
from html.parser import HTMLParser

import httpx
import pytest

from ringfence.models import AuditQuery
from ringfence.server.console.pages import SECURITY_HEADERS
from tests.console.conftest import Console, csrf_of, sign_in

pytestmark = pytest.mark.fakes  # logic: see tests/README.md, "Which backend"

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(document.cookie)>'


class _Page(HTMLParser):
    """The elements a browser would build from a page, and its text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _has_security_headers(response: httpx.Response) -> bool:
    return all(response.headers.get(name) == value for name, value in SECURITY_HEADERS.items())


async def test_agent_keys_and_bad_keys_cannot_sign_in(console: Console) -> None:
    async with console.client() as client:
        agent = await sign_in(client, console.api.acme_key)
        assert agent.status_code == 403 and "This is an agent key" in agent.text
        assert "ringfence_console=" not in agent.headers.get("set-cookie", "")
        for bad in ("rf_0123456789abcdef_" + "A" * 43, "not a key", ""):
            refused = await sign_in(client, bad)
            assert refused.status_code == 401 and "not a valid" in refused.text, bad
            assert "ringfence_console=" not in refused.headers.get("set-cookie", "")
        assert (await client.get("/console")).status_code == 303
    await console.api.services.audit.flush()
    denied = await console.api.store.list_audit(AuditQuery(tenant="acme", action="console."))
    assert [(r.action, r.outcome) for r in denied] == [("console.login", "denied")]


async def test_the_session_cookie_stands_for_the_key_without_holding_it(
    console: Console,
) -> None:
    async with console.client() as client:
        signed_in = await sign_in(client, console.approver)
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/console"
        cookie = next(
            c
            for c in signed_in.headers.get_list("set-cookie")
            if c.startswith("ringfence_console=")
        )
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/console"} <= attributes
        assert "secure" not in attributes  # plain http on loopback
        secret = console.approver.rsplit("_", 1)[1]
        assert secret not in cookie and console.approver not in cookie
        page = await client.get("/console")
        assert page.status_code == 200 and "Pending proposals" in page.text
        assert secret not in page.text
        out = await client.post("/console/logout", data={"csrf": csrf_of(page.text)})
        assert out.status_code == 303 and out.headers["location"] == "/console/login"
        client.cookies.set("ringfence_console", cookie.split(";")[0].split("=", 1)[1])
        assert (await client.get("/console")).status_code == 303  # the session is gone
    # Over https (as a TLS-terminating proxy on loopback tells uvicorn), the cookie is Secure.
    async with console.client(headers={"X-Forwarded-Proto": "https"}) as client:
        form = await client.get("/console/login")
        assert "secure" in form.headers["set-cookie"].lower()
        login_cookie = form.headers["set-cookie"].split(";")[0]
        signed_in = await client.post(
            "/console/login",
            data={"key": console.approver, "csrf": csrf_of(form.text)},
            headers={"Cookie": login_cookie},
        )
        assert signed_in.status_code == 303
        session_cookie = next(
            c
            for c in signed_in.headers.get_list("set-cookie")
            if c.startswith("ringfence_console=")
        )
        assert "secure" in session_cookie.lower()


async def test_every_page_needs_a_session(console: Console) -> None:
    proposal = await console.propose()
    async with console.client() as client:
        for path in ("/console", "/console/history", "/console/audit",
                     f"/console/proposals/{proposal['id']}"):  # fmt: skip
            response = await client.get(path)
            assert response.status_code == 303, path
            assert response.headers["location"] == "/console/login", path
        posted = await client.post(
            f"/console/proposals/{proposal['id']}/approve",
            data={"csrf": "x", "digest": proposal["digest"]},
        )
        assert posted.status_code == 403
    assert (await console.proposal(proposal["id"]))["approvals"] == []


async def test_a_form_post_without_its_csrf_token_decides_nothing(console: Console) -> None:
    proposal = await console.propose()
    approve = f"/console/proposals/{proposal['id']}/approve"
    reject = f"/console/proposals/{proposal['id']}/reject"
    async with console.client() as other:  # another approver's session and token
        await sign_in(other, console.second_approver)
        foreign = csrf_of((await other.get("/console")).text)
    async with console.client() as client:
        await sign_in(client, console.approver)
        own = csrf_of((await client.get(f"/console/proposals/{proposal['id']}")).text)
        for data in (
            {"digest": proposal["digest"]},
            {"digest": proposal["digest"], "csrf": ""},
            {"digest": proposal["digest"], "csrf": own[:-1] + ("A" if own[-1] != "A" else "B")},
            {"digest": proposal["digest"], "csrf": foreign},
        ):
            response = await client.post(approve, data=data)
            assert response.status_code == 403 and "security token" in response.text, data
            assert _has_security_headers(response)
            response = await client.post(reject, data={**data, "reason": "no"})
            assert response.status_code == 403, data
        json_body = await client.post(approve, json={"csrf": own, "digest": proposal["digest"]})
        assert json_body.status_code == 400  # only the console's own forms are read
    stored = await console.proposal(proposal["id"])
    assert stored["state"] == "pending" and stored["approvals"] == []


async def test_a_cross_origin_post_is_refused(console: Console) -> None:
    proposal = await console.propose()
    approve = f"/console/proposals/{proposal['id']}/approve"
    async with console.client() as client:
        await sign_in(client, console.approver)
        token = csrf_of((await client.get(f"/console/proposals/{proposal['id']}")).text)
        form = {"csrf": token, "digest": proposal["digest"], "reason": "ok"}
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
            {"Origin": console.url.replace("127.0.0.1", "localhost")},
            {"Origin": "https://" + console.url.split("://", 1)[1]},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
        ):
            response = await client.post(approve, data=form, headers=headers)
            assert response.status_code == 403 and "another site" in response.text, headers
        assert (await console.proposal(proposal["id"]))["approvals"] == []
        login = await client.post(
            "/console/login", data={"key": console.approver, "csrf": token},
            headers={"Origin": "http://evil.example"},
        )  # fmt: skip
        assert login.status_code == 403
        # The same form from the console's own origin is accepted: as a browser sends it
        # under Referrer-Policy: no-referrer (Origin: null, vouched for by Sec-Fetch-Site),
        # and with the origin spelled out.
        same = await client.post(
            approve, data=form, headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"}
        )
        assert same.status_code == 303
        assert "Approved" in (await client.get(f"/console/proposals/{proposal['id']}")).text
        explicit = await client.post(
            approve, data=form, headers={"Origin": console.url, "Sec-Fetch-Site": "same-origin"}
        )
        assert explicit.status_code == 303  # accepted, and refused by the service: not pending
    assert len((await console.finished(proposal["id"]))["approvals"]) == 1


@pytest.mark.every_store
async def test_agent_written_text_never_becomes_html(console: Console) -> None:
    hidden = "rm\u202e-rf /\u200b"  # a right-to-left override and a zero-width space
    proposal = await console.propose(
        request={
            "command": ["sh", "-c", f"echo '{SCRIPT}'", IMG, hidden],
            "env": {"SCRIPT_NAME": "value-not-shown-42"},
            "timeout": 30,
        },
        rationale=f"{SCRIPT}\n{IMG}",
        session_id=IMG,
    )
    async with console.client() as client:
        await sign_in(client, console.approver)
        pages = {
            "pending": await client.get("/console"),
            "proposal": await client.get(f"/console/proposals/{proposal['id']}"),
        }
        token = csrf_of(pages["proposal"].text)
        await client.post(
            f"/console/proposals/{proposal['id']}/reject",
            data={"csrf": token, "reason": f"no: {SCRIPT} {IMG}"},
        )
        pages["rejected"] = await client.get(f"/console/proposals/{proposal['id']}")
        pages["history"] = await client.get("/console/history")
        pages["audit"] = await client.get("/console/audit", params={"action": "proposal."})
        pages["audit-filter"] = await client.get("/console/audit", params={"actor": IMG})
    for name, page in pages.items():
        assert page.status_code == 200, name
        parsed = _Page(page.text)
        assert not [tag for tag, _ in parsed.tags if tag in ("script", "img", "iframe")], name
        handlers = [a for _, attrs in parsed.tags for a, _ in attrs if a.startswith("on")]
        assert handlers == [], name
        assert "\u202e" not in page.text and "\u200b" not in page.text, name
        if name != "audit-filter":
            assert any(SCRIPT in chunk for chunk in parsed.text), name  # shown, as text
    for name in ("pending", "proposal", "history"):
        text = pages[name].text
        assert html.escape(SCRIPT, quote=True) in text, name
        assert "&#34;&gt;&lt;img src=x onerror=alert(document.cookie)&gt;" in text, name
        assert r"rm<span class=\"esc\"".replace("\\", "") in text, name
        assert "\\u202e" in text and "\\u200b" in text, name
    assert "no: &lt;script&gt;" in pages["history"].text
    assert 'value="&#34;&gt;&lt;img' in pages["audit-filter"].text  # the filter echoed back
    # The approver sees every variable with its value: BASH_ENV=... would run code too.
    assert "SCRIPT_NAME=value-not-shown-42" in pages["proposal"].text


async def test_every_console_answer_carries_the_security_headers(console: Console) -> None:
    proposal = await console.propose()
    async with console.client() as client:
        answers = [
            await client.get("/console/login"),
            await client.get("/console"),  # a redirect to sign in
            await sign_in(client, console.approver),
            await client.get("/console"),
            await client.get(f"/console/proposals/{proposal['id']}"),
            await client.get("/console/proposals/cp-nonexistent"),
            await client.get("/console/history"),
            await client.get("/console/audit", params={"after": "-1"}),  # a 400 page
            await client.get("/console/static/console.css"),
            await client.get("/console/nowhere"),
            await client.post(f"/console/proposals/{proposal['id']}/approve", data={"x": "1"}),
        ]
    statuses = [a.status_code for a in answers]
    assert statuses == [200, 303, 303, 200, 200, 404, 200, 400, 200, 404, 403], statuses
    for answer in answers:
        assert _has_security_headers(answer), (answer.request.url, answer.headers)
        if answer.status_code >= 400:
            assert answer.headers["content-type"].startswith("text/html")
    csp = answers[0].headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
