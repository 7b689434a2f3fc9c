"""API keys: minted once, stored as a digest, checked in constant time.

A key reads ``rf_<key id>_<secret>``. The id finds the stored key; the secret (32 random
bytes) is stored only as its SHA-256 digest: a fast digest is enough for a secret that long.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ringfence.audit.chain import AuditEvent
from ringfence.errors import InvalidRequest, Unauthenticated
from ringfence.store import ApiKey, Role, Store

__all__ = [
    "ADMIN_KEY_FILE",
    "FIRST_TENANT",
    "KeyCache",
    "Principal",
    "authenticate",
    "bootstrap_admin_key",
    "mint_key",
    "new_key",
]

_TENANT = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_KEY = re.compile(r"^rf_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant and role of a valid key."""

    tenant: str
    role: Role
    key_id: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_key(tenant: str, role: Role, description: str = "") -> tuple[ApiKey, str]:
    """A fresh key: what the store keeps, and the key itself (shown once, never stored).

    Raises:
        InvalidRequest: the tenant name is not a DNS label (lowercase, digits, '-').
    """
    if not _TENANT.match(tenant):
        raise InvalidRequest(
            f"invalid tenant {tenant!r}: use 1-63 lowercase letters, digits and '-'"
        )
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    created = datetime.now(UTC).replace(microsecond=0)
    stored = ApiKey(key_id, tenant, role, _digest(secret), created, description)
    return stored, f"rf_{key_id}_{secret}"


async def mint_key(store: Store, tenant: str, role: Role, description: str = "") -> str:
    """Create a key in the store and return it; this is the only time it exists in clear.

    Raises:
        InvalidRequest: the tenant name is not a DNS label.
    """
    stored, key = new_key(tenant, role, description)
    await _store_key(store, stored)
    return key


async def _store_key(store: Store, stored: ApiKey) -> None:
    """Add the key and put it on the audit record (keys are rare: appended at once)."""
    await store.add_key(stored)
    details = {"role": stored.role.value, "description": stored.description}
    event = AuditEvent(stored.tenant, OPERATOR, "key.create", f"key:{stored.key_id}", "ok", details)
    await store.append_audit([event])


async def authenticate(
    store: Store, presented: str | None, cache: KeyCache | None = None
) -> Principal:
    """The principal behind a presented key; found keys are remembered in ``cache``.

    Raises:
        Unauthenticated: no key, a malformed key, or one that does not exist.
    """
    if not presented:
        raise Unauthenticated("an API key is required (Authorization: Bearer <key>)")
    match = _KEY.match(presented.strip())
    if match is None:
        raise Unauthenticated("malformed API key")
    key_id, secret = match.groups()
    stored = cache.get(key_id) if cache else None
    if stored is None:
        stored = await store.get_key(key_id)
        if stored is not None and cache is not None:
            cache.put(stored)
    # Compare even when the key is unknown, so timing does not tell which ids exist.
    expected = stored.secret_hash if stored else _digest("")
    if not hmac.compare_digest(expected, _digest(secret)) or stored is None:
        raise Unauthenticated("invalid API key")
    return Principal(stored.tenant, stored.role, key_id)


class KeyCache:
    """Stored keys (digests, never secrets) remembered for ``ttl`` seconds, so a request
    does not wait for the store (a SQLite lookup measured about 2 ms, most of a command's
    round-trip goal). Unknown ids are never cached. Keys cannot be revoked yet; when they
    can, a revocation takes up to ``ttl`` to reach a replica that cached the key."""

    def __init__(self, ttl: float = 10.0, max_keys: int = 10_000) -> None:
        self._ttl = ttl
        self._max_keys = max_keys
        self._keys: dict[str, tuple[ApiKey, float]] = {}

    def get(self, key_id: str) -> ApiKey | None:
        found = self._keys.get(key_id)
        if found is None or time.monotonic() - found[1] > self._ttl:
            return None
        return found[0]

    def put(self, key: ApiKey) -> None:
        if len(self._keys) >= self._max_keys:
            self._keys.clear()  # bounded; a refill costs one lookup per key
        self._keys[key.key_id] = (key, time.monotonic())


FIRST_TENANT = "default"
OPERATOR = "operator"  # the actor of what is done on the server's host (ringfence keys create)
ADMIN_KEY_FILE = "admin-key"


async def bootstrap_admin_key(store: Store, data_dir: Path) -> Path | None:
    """On a store without keys, mint an admin key for tenant ``default`` into
    ``<data_dir>/admin-key`` (readable by its owner only). Returns that path, or None when
    keys already exist.

    The file is written (atomically) before the key is stored, so a failure never leaves a
    stored admin key that nobody has.

    Raises:
        OSError: the file cannot be written.
    """
    if await store.count_keys():
        return None
    stored, key = new_key(FIRST_TENANT, Role.ADMIN, "created at first start")
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / ADMIN_KEY_FILE
    partial = path.with_name(f".{ADMIN_KEY_FILE}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (key + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
    await _store_key(store, stored)
    return path
