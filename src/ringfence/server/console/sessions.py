"""Console sessions and the checks every form post passes.

A session is a random token (the cookie) that maps, in this process's memory, to the
principal of the key that signed in, a CSRF token for its forms, and an expiry. The API key
itself is never stored or sent back: the session keeps its fingerprint (the digest of its
secret, ``keys.fingerprint``), and every console request checks that the key is still valid
(``keys.still_valid``), so a session ends once its key is revoked or rotated, on every
replica within ``KEY_CACHE_SECONDS``. Sessions do not survive a restart and are not shared
between server processes: behind several replicas, pin a browser to one of them (or sign
in again).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ringfence.service.keys import Principal

__all__ = [
    "COOKIE",
    "LOGIN_COOKIE",
    "Session",
    "SessionTable",
    "new_token",
    "same_origin",
    "tokens_match",
]

COOKIE = "ringfence_console"
LOGIN_COOKIE = "ringfence_console_login"  # the sign-in form's CSRF token (no session yet)
SESSION_SECONDS = 8 * 3600.0


def new_token() -> str:
    """A fresh random token: 32 bytes, URL-safe."""
    return secrets.token_urlsafe(32)


@dataclass
class Session:
    token: str
    principal: Principal
    csrf: str
    expires: float  # time.monotonic() deadline
    key_fingerprint: str = ""  # of the key that signed in; "" passes no check
    flash: list[tuple[str, str]] = field(default_factory=list)  # (kind, text), shown once

    def take_flash(self) -> list[tuple[str, str]]:
        flash, self.flash = self.flash, []
        return flash


class SessionTable:
    """Sessions by token, each valid for ``ttl`` seconds after sign-in; at most
    ``max_sessions`` (the oldest go first), so a flood of sign-ins cannot grow it unbounded."""

    def __init__(
        self,
        ttl: float = SESSION_SECONDS,
        max_sessions: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl
        self._max = max_sessions
        self._clock = clock
        self._sessions: dict[str, Session] = {}  # insertion order: oldest first

    @property
    def ttl(self) -> float:
        return self._ttl

    def create(self, principal: Principal, key_fingerprint: str = "") -> Session:
        now = self._clock()
        for token in [t for t, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[token]
        while len(self._sessions) >= self._max:
            del self._sessions[next(iter(self._sessions))]
        session = Session(
            token=new_token(),
            principal=principal,
            csrf=new_token(),
            expires=now + self._ttl,
            key_fingerprint=key_fingerprint,
        )
        self._sessions[session.token] = session
        return session

    def get(self, token: str | None) -> Session | None:
        """The live session for ``token``, or None (unknown, or expired: then dropped)."""
        if not token:
            return None
        session = self._sessions.get(token)
        if session is None:
            return None
        if session.expires <= self._clock():
            del self._sessions[token]
            return None
        return session

    def drop(self, token: str | None) -> None:
        if token:
            self._sessions.pop(token, None)


def tokens_match(expected: str, presented: str | None) -> bool:
    """Constant-time comparison of a CSRF token (an empty expected token never matches)."""
    if not expected or presented is None:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


def same_origin(headers: Mapping[str, str], scheme: str) -> bool:
    """Whether a POST may come from these headers: the browser's ``Sec-Fetch-Site`` (when
    sent) says this site sent it, and its ``Origin`` (when sent) is this server's own (the
    scheme it was reached over and the ``Host`` the browser addressed).

    ``Origin: null`` passes only with ``Sec-Fetch-Site: same-origin``: under the console's
    ``Referrer-Policy: no-referrer`` a browser sends ``null`` for its own form posts, while
    a sandboxed frame or another site's page sending ``null`` is marked ``cross-site``.
    """
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is None:
        return True
    if origin == "null":
        return fetch_site == "same-origin"
    host = headers.get("host")
    if not host:
        return False
    parts = urlsplit(origin)
    return parts.scheme == scheme and parts.netloc.lower() == host.lower() and not parts.path
