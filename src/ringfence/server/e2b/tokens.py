"""Per-sandbox access tokens for E2B's sandbox traffic (envd and the code interpreter).

E2B's SDKs never send the API key to a sandbox: they send the ``envdAccessToken`` the
control plane handed out (``X-Access-Token``) and, to the code interpreter, the
``trafficAccessToken`` (``E2B-Traffic-Access-Token``). Knowing a sandbox id is therefore not
enough to drive it.

A token is derived, not stored: ``<tenant>.<key id>.<generation>.<mac>`` where the mac is an
HMAC-SHA256 of (purpose, tenant, key id, the key's generation, sandbox id) under a secret this
server process draws at start. The generation names the key's secret (``keys.generation``):
the door refuses a token, and a URL it signed, once its key is rotated or revoked.
Verifying one needs no store and tells who acts (the tenant, and the key the token was
handed to, for the audit record). The secret need not outlive the process: sandboxes die
with the server that runs them, and so may their tokens. Each key that creates or connects
gets its own token; a pooled sandbox gets a fresh id at its claim, hence a fresh token.

Signed file URLs (``download_url``/``upload_url``) carry no sandbox id when every sandbox
shares one ``E2B_SANDBOX_URL``; the sandbox is found by recomputing each issued token's
signature (``Grants`` remembers which tokens were handed out, a bounded few: a URL's
format leaves no room for anything that would find its grant directly, since the official
SDKs build it themselves).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["MAX_REMEMBERED", "Grant", "Grants", "Purpose", "expired", "file_signature"]

# Handed-out grants kept for signed URLs (oldest forgotten first). A signed URL is checked
# before anyone is known, and a miss hashes once per grant kept (~1.5-3 µs each): this bound
# keeps a forged URL under ~6 ms of the event loop. The E2B door forgets ended sandboxes'
# grants as it goes, so only live (sandbox, key) pairs count against it.
MAX_REMEMBERED = 2048


class Purpose(StrEnum):
    ENVD = "envd"  # X-Access-Token: envd, and the code interpreter
    TRAFFIC = "traffic"  # E2B-Traffic-Access-Token: the code interpreter only
    VOLUME = "volume"  # a volume's token (the grant's sandbox_id is the volume's id)


@dataclass(frozen=True)
class Grant:
    """Who a valid token speaks for, about which sandbox."""

    tenant: str
    key_id: str
    generation: str  # of the key's secret when the token was handed out
    sandbox_id: str


class Grants:
    """Mint and check access tokens; remember the grants handed out (for signed URLs)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)
        # grant → its envd token, insertion-ordered: the oldest first
        self._issued: dict[Grant, str] = {}

    def __len__(self) -> int:
        return len(self._issued)

    def token(self, grant: Grant, purpose: Purpose) -> str:
        """The token for ``grant``; remembered, so that its signed URLs resolve."""
        self._issued.pop(grant, None)
        self._issued[grant] = self._token(grant, Purpose.ENVD)
        while len(self._issued) > MAX_REMEMBERED:
            del self._issued[next(iter(self._issued))]
        return self._token(grant, purpose)

    def token_only(self, grant: Grant, purpose: Purpose) -> str:
        """The token for ``grant``, not remembered: no signed URL resolves through it (a
        volume's)."""
        return self._token(grant, purpose)

    def issued(self) -> list[Grant]:
        return list(self._issued)

    def check(self, token: str | None, sandbox_id: str, purpose: Purpose) -> Grant | None:
        """The grant behind ``token`` if it was minted for ``sandbox_id`` and ``purpose``."""
        if not token:
            return None
        tenant, key_id, generation, _ = [*token.split(".", 3), "", "", ""][:4]
        grant = Grant(tenant, key_id, generation, sandbox_id)
        if hmac.compare_digest(self._token(grant, purpose).encode(), token.encode()):
            return grant
        return None

    def by_signature(
        self, path: str, operation: str, user: str, signature: str, expiration: str | None
    ) -> Grant | None:
        """The handed-out grant whose envd token signed this file URL, if any (expiry is
        the caller's to check). One SHA-256 per remembered grant: ``forget`` ended ones."""
        for grant, token in list(self._issued.items()):
            expected = file_signature(path, operation, user, token, expiration)
            if hmac.compare_digest(expected.encode(), signature.encode()):
                return grant
        return None

    def forget(self, sandbox_id: str) -> None:
        """Drop the grants of an ended sandbox (its tokens stay invalid for its id: the
        sandbox is gone, and ids are never reused)."""
        for grant in [g for g in self._issued if g.sandbox_id == sandbox_id]:
            del self._issued[grant]

    def _token(self, grant: Grant, purpose: Purpose) -> str:
        fields = (purpose.value, grant.tenant, grant.key_id, grant.generation, grant.sandbox_id)
        mac = hmac.new(self._secret, "\0".join(fields).encode(), hashlib.sha256).digest()
        encoded = base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
        return f"{grant.tenant}.{grant.key_id}.{grant.generation}.{encoded}"


def file_signature(path: str, operation: str, user: str, token: str, expiration: str | None) -> str:
    """E2B's v1 file URL signature: ``v1_`` + base64(sha256(path:op:user:token[:exp]))."""
    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration else "")
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode()


def expired(expiration: str | None) -> bool:
    """Whether a signed URL's ``signature_expiration`` (Unix seconds) has passed; a malformed
    one counts as passed."""
    if expiration is None:
        return False
    try:
        return int(expiration) < time.time()
    except ValueError:
        return True
