"""``/console``: the approval console's pages and forms.

Every page needs a session (sign in with an approver or admin key); every form post needs
the session's CSRF token and a same-origin request. The pages call the approval service,
the egress asks and the audit log, as the JSON API does; what they show an approver is what
an approval binds to: the approve form carries the digest of the request as this page
rendered it (an egress ask is bound by its id: one sandbox, one host, one port).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import Response

from ringfence.errors import HTTP_STATUS, RingfenceError, Unauthenticated
from ringfence.models import ApiKey, AuditQuery, Proposal, ProposalState, Role, request_digest
from ringfence.server import deps
from ringfence.server.console.pages import STYLESHEET, expires_in, redirect, render, secure
from ringfence.server.console.sessions import (
    COOKIE,
    LOGIN_COOKIE,
    Session,
    new_token,
    same_origin,
    tokens_match,
)
from ringfence.service.egress_asks import EgressAsk, EgressAskState
from ringfence.service.keys import fingerprint

__all__ = ["router"]

_FORM_BYTES = 64 << 10
_LOGIN_SECONDS = 600
_LISTED = 200
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_DECIDED = (
    ProposalState.APPROVED,
    ProposalState.EXECUTING,
    ProposalState.SUCCEEDED,
    ProposalState.FAILED,
    ProposalState.REJECTED,
    ProposalState.EXPIRED,
)


class _ConsoleRoute(APIRoute):
    """Console routes answer with HTML pages, errors included, each with the security
    headers: a service error or a malformed query becomes a readable page, never JSON or a
    500 with a traceback."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                await _end_session_of_a_dead_key(request)
                response = await handler(request)
            except RequestValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
                    for e in exc.errors()
                )
                response = _error(request, 400, f"That request is not valid: {problems}")
            except RingfenceError as exc:
                response = _error(request, HTTP_STATUS.get(exc.code, 500), exc.message)
            return secure(response)

        return guarded


router = APIRouter(prefix="/console", route_class=_ConsoleRoute, include_in_schema=False)


# --- plumbing -----------------------------------------------------------------------------


def _asks_of(request: Request, tenant: str, *, pending: bool) -> list[EgressAsk]:
    listed = deps.asks(request).list(tenant, pending_only=pending)
    if not pending:
        listed = [ask for ask in listed if ask.state is not EgressAskState.PENDING]
    return listed[:_LISTED]


def _session(request: Request) -> Session | None:
    return deps.console_sessions(request).get(request.cookies.get(COOKIE))


async def _end_session_of_a_dead_key(request: Request) -> None:
    """Before any console page: end the session if its key was revoked or rotated since
    it signed in (``still_valid``; another replica's change is seen within 2 s)."""
    session = _session(request)
    if session is None:
        return
    principal = session.principal
    if await deps.keys(request).still_valid(principal.key_id, session.key_fingerprint):
        return
    deps.console_sessions(request).drop(session.token)
    deps.audit(request).record(
        principal.tenant, principal.key_id, "console.logout", f"key:{principal.key_id}",
        "ok", {"why": "the key was revoked or rotated"},
    )  # fmt: skip


def _secure_cookie(request: Request) -> bool:
    return request.url.scheme == "https"


def _error(request: Request, status: int, message: str) -> Response:
    session = _session(request)
    return render(
        "error.html",
        status=status,
        session=session,
        csrf=session.csrf if session else "",
        status_code=status,
        message=message,
    )


def _refused(request: Request, why: str) -> Response:
    return _error(request, 403, f"Refused: {why}. Nothing was changed.")


async def _form(request: Request) -> dict[str, str] | None:
    """The posted form's fields (the first of each name), or None if it is not a small
    URL-encoded form."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_BYTES:
            return None
    try:
        pairs = parse_qsl(
            body.decode(), keep_blank_values=True, strict_parsing=False, max_num_fields=16
        )
    except (UnicodeDecodeError, ValueError):
        return None
    fields: dict[str, str] = {}
    for name, value in pairs:
        fields.setdefault(name, value)
    return fields


async def _checked_post(request: Request) -> tuple[Session, dict[str, str]] | Response:
    """The session and form of a POST that passed every check, or the refusal page."""
    session = _session(request)
    if session is None:
        return _refused(request, "your session has ended; sign in again")
    if not same_origin(request.headers, request.url.scheme):
        return _refused(request, "this form was sent from another site")
    form = await _form(request)
    if form is None:
        return _error(request, 400, "That form could not be read.")
    if not tokens_match(session.csrf, form.get("csrf")):
        return _refused(request, "the form's security token is missing or wrong (reload it)")
    return session, form


def _page(request: Request, template: str, session: Session, **context: Any) -> Response:
    return render(
        template,
        session=session,
        csrf=session.csrf,
        flash=session.take_flash(),
        now=datetime.now(UTC),
        **context,
    )


# --- signing in and out -------------------------------------------------------------------


def _login_page(request: Request, status: int = 200, error: str | None = None) -> Response:
    token = new_token()
    response = render("login.html", status=status, session=None, csrf=token, error=error)
    response.set_cookie(
        LOGIN_COOKIE,
        token,
        max_age=_LOGIN_SECONDS,
        path="/console/login",
        secure=_secure_cookie(request),
        httponly=True,
        samesite="strict",
    )
    return response


@router.get("/login")
async def login_form(request: Request) -> Response:
    if _session(request) is not None:
        return redirect("/console")
    return _login_page(request)


@router.post("/login")
async def login(request: Request) -> Response:
    if not same_origin(request.headers, request.url.scheme):
        return _refused(request, "this form was sent from another site")
    form = await _form(request)
    if form is None:
        return _error(request, 400, "That form could not be read.")
    if not tokens_match(request.cookies.get(LOGIN_COOKIE, ""), form.get("csrf")):
        return _refused(request, "the sign-in form expired or was not sent from this page")
    presented = form.get("key", "")
    try:
        principal = await deps.keys(request).authenticate(presented)
    except Unauthenticated:
        return _login_page(request, 401, "That key is not a valid Ringfence API key.")
    if principal.role is Role.AGENT:
        deps.audit(request).record(
            principal.tenant, principal.key_id, "console.login", f"key:{principal.key_id}",
            "denied", {"why": "agent key"},
        )  # fmt: skip
        return _login_page(
            request,
            403,
            "This is an agent key. Agents propose remediations; only approver and admin "
            "keys can sign in to the console and decide on them.",
        )
    session = deps.console_sessions(request).create(principal, fingerprint(presented))
    deps.audit(request).record(
        principal.tenant, principal.key_id, "console.login", f"key:{principal.key_id}"
    )
    response = redirect("/console")
    response.set_cookie(
        COOKIE,
        session.token,
        max_age=int(deps.console_sessions(request).ttl),
        path="/console",
        secure=_secure_cookie(request),
        httponly=True,
        samesite="strict",
    )
    response.delete_cookie(LOGIN_COOKIE, path="/console/login")
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    checked = await _checked_post(request)
    if isinstance(checked, Response):
        return checked
    session, _ = checked
    deps.console_sessions(request).drop(session.token)
    principal = session.principal
    deps.audit(request).record(
        principal.tenant, principal.key_id, "console.logout", f"key:{principal.key_id}"
    )
    response = redirect("/console/login")
    response.delete_cookie(COOKIE, path="/console")
    return response


# --- proposals ----------------------------------------------------------------------------


@router.get("")
async def pending(request: Request) -> Response:
    session = _session(request)
    if session is None:
        return redirect("/console/login")
    tenant = session.principal.tenant
    proposals = await deps.approvals(request).list(
        tenant, states=[ProposalState.PENDING], limit=_LISTED
    )
    return _page(
        request,
        "pending.html",
        session,
        proposals=[await _shown(request, tenant, p) for p in proposals],
        asks=_asks_of(request, tenant, pending=True),
    )


@router.get("/proposals/{proposal_id}")
async def proposal_page(proposal_id: str, request: Request) -> Response:
    session = _session(request)
    if session is None:
        return redirect("/console/login")
    tenant = session.principal.tenant
    proposal = await deps.approvals(request).get(tenant, proposal_id)
    return _page(request, "proposal.html", session, p=await _shown(request, tenant, proposal))


@router.post("/proposals/{proposal_id}/approve")
async def approve(proposal_id: str, request: Request) -> Response:
    checked = await _checked_post(request)
    if isinstance(checked, Response):
        return checked
    session, form = checked
    digest = form.get("digest", "")
    if not _HEX64.match(digest):
        return _error(request, 400, "The approval names no request digest.")
    try:
        decided = await deps.approvals(request).approve(
            session.principal, proposal_id, digest, form.get("reason", "")[:10_000]
        )
    except RingfenceError as exc:
        session.flash.append(("error", f"Not approved: {exc.message}"))
    else:
        if decided.state is ProposalState.PENDING:
            count = f"{len(decided.approvals)} of {decided.required_approvals}"
            session.flash.append(("ok", f"Approved ({count}): it waits for another approver."))
        else:
            session.flash.append(("ok", "Approved: it is running now."))
    return redirect(f"/console/proposals/{quote(proposal_id, safe='')}")


@router.post("/proposals/{proposal_id}/reject")
async def reject(proposal_id: str, request: Request) -> Response:
    checked = await _checked_post(request)
    if isinstance(checked, Response):
        return checked
    session, form = checked
    reason = form.get("reason", "")[:10_000]
    if not reason.strip():
        session.flash.append(("error", "Not rejected: a rejection needs a reason."))
    else:
        try:
            await deps.approvals(request).reject(session.principal, proposal_id, reason)
        except RingfenceError as exc:
            session.flash.append(("error", f"Not rejected: {exc.message}"))
        else:
            session.flash.append(("ok", "Rejected."))
    return redirect(f"/console/proposals/{quote(proposal_id, safe='')}")


@router.get("/history")
async def history(request: Request) -> Response:
    session = _session(request)
    if session is None:
        return redirect("/console/login")
    tenant = session.principal.tenant
    proposals = await deps.approvals(request).list(tenant, states=_DECIDED, limit=_LISTED)
    return _page(
        request,
        "history.html",
        session,
        proposals=[await _shown(request, tenant, p) for p in proposals],
        asks=_asks_of(request, tenant, pending=False),
    )


async def _shown(request: Request, tenant: str, proposal: Proposal) -> dict[str, Any]:
    """What a page shows of a proposal; ``rendered_digest`` is computed from the request as
    rendered now, so an approval posts the digest of what the approver saw. ``placement``
    is where it would run on this server; ``people`` the names of the keys involved."""
    rendered = request_digest(proposal.request)
    return {
        "proposal": proposal,
        "request": proposal.request,
        "rendered_digest": rendered,
        "digest_holds": rendered == proposal.digest,
        "placement": deps.executions(request).placement(tenant, proposal.request),
        "people": await _people(request, tenant, proposal),
        "expires_in": expires_in(proposal.expires_at, datetime.now(UTC)),
    }


async def _people(request: Request, tenant: str, proposal: Proposal) -> dict[str, str]:
    """The names of the keys that proposed and decided ``proposal``, by key id (a key
    without a name, or of another tenant, has none: the page shows its id alone)."""
    keys = deps.keys(request)
    ids = {proposal.proposed_by, *(d.by for d in proposal.approvals)}
    if proposal.rejection is not None:
        ids.add(proposal.rejection.by)
    names: dict[str, str] = {}
    for key_id in ids:
        key = await keys.find(key_id)
        if key is not None and key.tenant == tenant and _key_name(key):
            names[key_id] = _key_name(key)
    return names


def _key_name(key: ApiKey) -> str:
    """The name a key was created with (``ringfence keys create --name``); for keys made
    before names, their description."""
    return key.name or key.description


# --- egress asks ---------------------------------------------------------------------------


@router.post("/asks/{ask_id}/approve")
async def approve_ask(ask_id: str, request: Request) -> Response:
    return await _decide_ask(request, ask_id, approve=True)


@router.post("/asks/{ask_id}/reject")
async def reject_ask(ask_id: str, request: Request) -> Response:
    return await _decide_ask(request, ask_id, approve=False)


async def _decide_ask(request: Request, ask_id: str, *, approve: bool) -> Response:
    """Decide through the egress asks service, whose rules (deciders' roles, never the
    requester's own key, pending only) and audit records are the API's."""
    checked = await _checked_post(request)
    if isinstance(checked, Response):
        return checked
    session, form = checked
    asks = deps.asks(request)
    reason = form.get("reason", "")[:10_000]
    verb = "approved" if approve else "rejected"
    if not approve and not reason.strip():
        session.flash.append(("error", "Not rejected: a rejection needs a reason."))
        return redirect("/console")
    try:
        decided = await asks.decide(session.principal, ask_id, approve, reason)
    except RingfenceError as exc:
        session.flash.append(("error", f"Not {verb}: {exc.message}"))
    else:
        where = f"{decided.host}:{decided.port}"
        if approve:
            session.flash.append(("ok", f"Approved: {decided.sandbox} may reach {where}."))
        else:
            session.flash.append(("ok", f"Rejected: {decided.sandbox} may not reach {where}."))
    return redirect("/console")


# --- audit --------------------------------------------------------------------------------


@router.get("/audit")
async def audit_page(
    request: Request,
    action: Annotated[str, Query(max_length=200)] = "",
    actor: Annotated[str, Query(max_length=200)] = "",
    target: Annotated[str, Query(max_length=300)] = "",
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> Response:
    session = _session(request)
    if session is None:
        return redirect("/console/login")
    query = AuditQuery(
        tenant=session.principal.tenant,
        actor=actor or None,
        action=action or None,
        target=target or None,
        after_seq=after,
        limit=limit,
    )
    records = await deps.audit(request).query(query)
    filters = {"action": action, "actor": actor, "target": target, "limit": str(limit)}
    next_after = records[-1].seq if len(records) == limit else None
    return _page(
        request,
        "audit.html",
        session,
        records=records,
        filters=filters,
        after=after,
        next_after=next_after,
    )


# --- the rest -----------------------------------------------------------------------------


@router.get("/static/console.css")
async def stylesheet() -> Response:
    return Response(STYLESHEET, media_type="text/css")


@router.api_route("/{rest:path}", methods=["GET", "POST"])
async def not_found(rest: str, request: Request) -> Response:
    if rest == "":
        return redirect("/console")
    return _error(request, 404, "There is no such page in the console.")
