"""API keys: minted once, stored as a digest, checked in constant time; listed, revoked
and rotated by admins (``ringfence keys``, ``/v1/keys``).

A key reads ``rf_<key id>_<secret>``. The id finds the stored key; the secret (32 random
bytes) is stored only as its SHA-256 digest: a fast digest is enough for a secret that long.
The key in clear exists once, in the answer that made it (create, rotate).

Revocation and rotation are seen by every replica within ``KEY_CACHE_SECONDS``: that is how
long a replica trusts a key it read from the store. The replica that revokes forgets the
key at once. A rotated key keeps its id, name and role (what it did stays its own in the
audit log, and the one who proposed still cannot approve); only its secret changes.
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
from ringfence.errors import Conflict, InvalidRequest, NotFound, Unauthenticated
from ringfence.models import ApiKey, Role
from ringfence.store import Store

__all__ = [
    "ADMIN_KEY_FILE",
    "FIRST_TENANT",
    "KEY_CACHE_SECONDS",
    "KeyCache",
    "Keys",
    "Principal",
    "authenticate",
    "bootstrap_admin_key",
    "fingerprint",
    "generation",
    "in_force",
    "list_keys",
    "mint_key",
    "new_key",
    "revoke_key",
    "rotate_key",
    "still_valid",
]

_TENANT = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_KEY = re.compile(r"^rf_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")
MAX_NAME = 100
KEY_CACHE_SECONDS = 2.0


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant and role of a valid key, and the name it was made with."""

    tenant: str
    role: Role
    key_id: str
    name: str = ""
    generation: str = ""  # which secret of the key: ``generation``; changes at each rotation


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def generation(key: ApiKey) -> str:
    """Which secret ``key`` has (a short digest of its secret's digest, never the secret):
    what was handed to a key and is presented without it (E2B's access tokens, signed URLs)
    carries it, so that rotating the key, the answer to a leak, ends those too."""
    return hashlib.sha256(f"generation\0{key.secret_hash}".encode()).hexdigest()[:16]


def _checked_name(name: str) -> str:
    name = name.strip()
    if len(name) > MAX_NAME or any(not c.isprintable() for c in name):
        raise InvalidRequest(f"name: at most {MAX_NAME} printable characters")
    return name


def new_key(tenant: str, role: Role, description: str = "", name: str = "") -> tuple[ApiKey, str]:
    """A fresh key: what the store keeps, and the key itself (shown once, never stored).

    Raises:
        InvalidRequest: the tenant name is not a DNS label (lowercase, digits, '-'), or
            the name is too long or has control characters.
    """
    if not _TENANT.match(tenant):
        raise InvalidRequest(
            f"invalid tenant {tenant!r}: use 1-63 lowercase letters, digits and '-'"
        )
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    created = datetime.now(UTC).replace(microsecond=0)
    stored = ApiKey(
        key_id, tenant, role, _digest(secret), created, description, _checked_name(name)
    )
    return stored, f"rf_{key_id}_{secret}"


async def mint_key(
    store: Store, tenant: str, role: Role, description: str = "", name: str = ""
) -> str:
    """Create a key in the store and return it; this is the only time it exists in clear.

    Raises:
        InvalidRequest: the tenant name is not a DNS label, or the name is not valid.
    """
    stored, key = new_key(tenant, role, description, name)
    await _store_key(store, stored)
    return key


async def _store_key(store: Store, stored: ApiKey) -> None:
    """Add the key and put it on the audit record (keys are rare: appended at once)."""
    await store.add_key(stored)
    details = {"role": stored.role.value, "description": stored.description, "name": stored.name}
    event = AuditEvent(stored.tenant, OPERATOR, "key.create", f"key:{stored.key_id}", "ok", details)
    await store.append_audit([event])


async def list_keys(store: Store, tenant: str | None) -> list[ApiKey]:
    """The keys of ``tenant`` (None: every tenant's, for the operator), oldest first.

    Raises:
        StoreError: the store failed.
    """
    return await store.list_keys(tenant)


async def _key_of(store: Store, key_id: str, tenant: str | None) -> ApiKey:
    key = await store.get_key(key_id) if _KEY_ID.match(key_id) else None
    if key is None or (tenant is not None and key.tenant != tenant):
        raise NotFound(f"no key with id {key_id!r}")  # another tenant's looks the same
    return key


async def revoke_key(
    store: Store,
    key_id: str,
    actor: str,
    tenant: str | None = None,
    cache: KeyCache | None = None,
) -> ApiKey:
    """Revoke a key for good: from now on it is refused by this replica (``cache`` forgets
    it), and by every other within ``KEY_CACHE_SECONDS``. Revoking it again changes nothing.
    ``tenant``: the caller's (None: the operator, any tenant).

    Raises:
        NotFound: no key with this id (in ``tenant``).
    """
    known = await _key_of(store, key_id, tenant)
    if known.revoked:
        return known  # revoked once, for good: nothing changes, nothing to record
    revoked = await store.revoke_key(key_id, datetime.now(UTC))
    if revoked is None:
        raise NotFound(f"no key with id {key_id!r}")
    await _changed(store, revoked, actor, "key.revoke", cache)
    return revoked


async def rotate_key(
    store: Store,
    key_id: str,
    actor: str,
    tenant: str | None = None,
    cache: KeyCache | None = None,
) -> tuple[ApiKey, str]:
    """Give a key a new secret (the same id, name and role) and return it with the new key
    in clear (the only time it exists so). The old secret is refused from now on by this
    replica, by every other within ``KEY_CACHE_SECONDS``; console sessions signed in with
    it end.

    Raises:
        NotFound: no key with this id (in ``tenant``).
        Conflict: the key is revoked (a revoked key stays revoked).
    """
    await _key_of(store, key_id, tenant)
    secret = secrets.token_urlsafe(32)
    rotated = await store.rotate_key(key_id, _digest(secret), datetime.now(UTC))
    if rotated is None:
        raise Conflict(f"key {key_id!r} is revoked: create a new one instead")
    await _changed(store, rotated, actor, "key.rotate", cache)
    return rotated, f"rf_{key_id}_{secret}"


async def _changed(
    store: Store, key: ApiKey, actor: str, action: str, cache: KeyCache | None
) -> None:
    """This replica forgets ``key`` at once; the change goes on the audit record."""
    if cache is not None:
        cache.forget(key.key_id)
    details = {"name": key.name, "role": key.role.value}
    event = AuditEvent(key.tenant, actor, action, f"key:{key.key_id}", "ok", details)
    await store.append_audit([event])


async def authenticate(
    store: Store, presented: str | None, cache: KeyCache | None = None
) -> Principal:
    """The principal behind a presented key; keys read from the store are remembered in
    ``cache`` for ``KEY_CACHE_SECONDS``.

    Raises:
        Unauthenticated: no key, a malformed key, one that does not exist, or one revoked.
    """
    if not presented:
        raise Unauthenticated("an API key is required (Authorization: Bearer <key>)")
    match = _KEY.match(presented.strip())
    if match is None:
        raise Unauthenticated("malformed API key")
    key_id, secret = match.groups()
    stored = await _matching(store, key_id, _digest(secret), cache)
    if stored is None:
        raise Unauthenticated("invalid API key")
    if stored.revoked:
        raise Unauthenticated("this API key was revoked")
    return Principal(stored.tenant, stored.role, key_id, stored.name, generation(stored))


def fingerprint(presented: str) -> str:
    """What a session keeps of the key that opened it, to tell later whether that key is
    still valid (``still_valid``): the digest of its secret, never the secret ("" for a
    malformed key)."""
    match = _KEY.match(presented.strip())
    return _digest(match.group(2)) if match else ""


async def still_valid(
    store: Store, key_id: str, key_fingerprint: str, cache: KeyCache | None = None
) -> bool:
    """Whether the key that opened a session is still valid: not revoked, not rotated.

    Raises:
        StoreError: the store failed.
    """
    if not key_fingerprint:
        return False
    stored = await _matching(store, key_id, key_fingerprint, cache)
    return stored is not None and not stored.revoked


async def in_force(
    store: Store, key_id: str, key_generation: str, cache: KeyCache | None = None
) -> bool:
    """Whether the key is still in force with the secret of ``key_generation`` (exists, not
    revoked, not rotated since): for what was handed to a key and is presented without it
    (E2B's per-sandbox access tokens, signed URLs).

    Raises:
        StoreError: the store failed.
    """
    stored = await _stored(store, key_id, cache)
    if stored is None or stored.revoked:
        return False
    return hmac.compare_digest(generation(stored), key_generation)


async def _matching(
    store: Store, key_id: str, digest: str, cache: KeyCache | None
) -> ApiKey | None:
    """The stored key whose digest is ``digest``, or None. A remembered key whose digest
    differs is read again (it may have been rotated since, by another replica), once per
    ``cache``'s ttl: wrong secrets for a known id do not each cost a store read."""
    stored = cache.get(key_id) if cache is not None else None
    differs = stored is not None and not hmac.compare_digest(stored.secret_hash, digest)
    if stored is None or (differs and cache is not None and cache.reread(key_id)):
        stored = await _stored(store, key_id, cache, fresh=True)
    # Compare even when the key is unknown, so timing does not tell which ids exist.
    expected = stored.secret_hash if stored else _digest("")
    if not hmac.compare_digest(expected, digest) or stored is None:
        return None
    return stored


async def _stored(
    store: Store, key_id: str, cache: KeyCache | None, *, fresh: bool = False
) -> ApiKey | None:
    """The key as ``cache`` remembers it, else (or when ``fresh``) as the store has it now."""
    stored = cache.get(key_id) if cache is not None and not fresh else None
    if stored is None:
        stored = await store.get_key(key_id)
        if stored is not None and cache is not None:
            cache.put(stored)
    return stored


class KeyCache:
    """Stored keys (digests, never secrets) remembered for ``ttl`` seconds, so a request
    does not wait for the store (a SQLite lookup measured about 2 ms, most of a command's
    round-trip goal). Unknown ids are never cached. ``ttl`` bounds how long another
    replica's revocation or rotation takes to reach this one, and how long its new secret
    may take (at once, unless a wrong secret for that id made this replica read it lately)."""

    def __init__(self, ttl: float = KEY_CACHE_SECONDS, max_keys: int = 10_000) -> None:
        self._ttl = ttl
        self._max_keys = max_keys
        self._keys: dict[str, tuple[ApiKey, float]] = {}
        self._reread: dict[str, float] = {}  # key id → when a differing secret read it again

    def get(self, key_id: str) -> ApiKey | None:
        found = self._keys.get(key_id)
        if found is None or time.monotonic() - found[1] > self._ttl:
            return None
        return found[0]

    def put(self, key: ApiKey) -> None:
        if len(self._keys) >= self._max_keys:
            self._keys.clear()  # bounded; a refill costs one lookup per key
        self._keys[key.key_id] = (key, time.monotonic())

    def reread(self, key_id: str) -> bool:
        """Whether a secret that differs from the remembered key's may have the store read
        again: once per ``ttl`` and key id (it is then noted as read)."""
        now = time.monotonic()
        if now - self._reread.get(key_id, -self._ttl - 1) <= self._ttl:
            return False
        if len(self._reread) >= self._max_keys:
            self._reread.clear()
        self._reread[key_id] = now
        return True

    def forget(self, key_id: str) -> None:
        self._keys.pop(key_id, None)
        self._reread.pop(key_id, None)


class Keys:
    """The API keys of one store, as the entry points use them: the server's doors check
    presented keys (``authenticate``, and ``still_valid``/``in_force`` for what a key was
    handed: console sessions, E2B access tokens), admins and the operator manage them.

    One per replica (``ringfence.compose`` builds it): its ``KeyCache`` is what lets a
    request skip the store, and what a revocation or rotation made here forgets at once.
    Each method is the module function of the same purpose over this store and cache, with
    the contract stated there.
    """

    def __init__(self, store: Store, cache: KeyCache | None = None) -> None:
        self._store = store
        self._cache = cache if cache is not None else KeyCache()

    async def authenticate(self, presented: str | None) -> Principal:
        """See ``authenticate``. Raises: Unauthenticated."""
        return await authenticate(self._store, presented, self._cache)

    async def still_valid(self, key_id: str, key_fingerprint: str) -> bool:
        """See ``still_valid``: the key that opened a session is neither revoked nor rotated."""
        return await still_valid(self._store, key_id, key_fingerprint, self._cache)

    async def in_force(self, key_id: str, key_generation: str) -> bool:
        """See ``in_force``: the key still has the secret of ``key_generation``."""
        return await in_force(self._store, key_id, key_generation, self._cache)

    async def find(self, key_id: str) -> ApiKey | None:
        """The key with this id as the store has it now (any tenant's), or None.

        Raises:
            StoreError: the store failed.
        """
        return await self._store.get_key(key_id)

    async def mint(self, tenant: str, role: Role, description: str = "", name: str = "") -> str:
        """See ``mint_key``: the new key, in clear this once. Raises: InvalidRequest."""
        return await mint_key(self._store, tenant, role, description, name)

    async def list_for(self, tenant: str | None) -> list[ApiKey]:
        """See ``list_keys``: ``tenant``'s keys (None: every tenant's), oldest first."""
        return await list_keys(self._store, tenant)

    async def revoke(self, key_id: str, actor: str, tenant: str | None = None) -> ApiKey:
        """See ``revoke_key``. Raises: NotFound."""
        return await revoke_key(self._store, key_id, actor, tenant, self._cache)

    async def rotate(
        self, key_id: str, actor: str, tenant: str | None = None
    ) -> tuple[ApiKey, str]:
        """See ``rotate_key``: the rotated key and the new key in clear. Raises: NotFound,
        Conflict."""
        return await rotate_key(self._store, key_id, actor, tenant, self._cache)

    async def bootstrap_admin(self, data_dir: Path) -> Path | None:
        """See ``bootstrap_admin_key``: on a store without keys, the first admin key's file."""
        return await bootstrap_admin_key(self._store, data_dir)


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
    stored, key = new_key(FIRST_TENANT, Role.ADMIN, "created at first start", "admin")
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
