"""API keys: minted once, stored as a digest, the first one handed to the operator safely."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfence.errors import InvalidRequest, Unauthenticated
from ringfence.models import ApiKey, Role
from ringfence.service.keys import KeyCache, authenticate, bootstrap_admin_key, mint_key, rotate_key
from ringfence.store import MemoryStore


async def test_a_key_authenticates_as_its_tenant_and_only_its_digest_is_stored() -> None:
    store = MemoryStore()
    key = await mint_key(store, "acme", Role.APPROVER, "ci")
    principal = await authenticate(store, key)
    assert (principal.tenant, principal.role) == ("acme", Role.APPROVER)
    stored = await store.get_key(principal.key_id)
    assert stored is not None and key.split("_", 2)[2] not in stored.secret_hash
    with pytest.raises(Unauthenticated):
        await authenticate(store, key[:-1] + ("A" if key[-1] != "A" else "B"))


async def test_tenant_names_are_dns_labels() -> None:
    for bad in ("", "Acme", "a b", "-a", "a" * 64, "ünï"):
        with pytest.raises(InvalidRequest):
            await mint_key(MemoryStore(), bad, Role.AGENT)


async def test_the_first_admin_key_is_private_even_over_an_old_file(tmp_path: Path) -> None:
    store = MemoryStore()
    (tmp_path / "admin-key").write_text("stale")
    (tmp_path / "admin-key").chmod(0o644)
    path = await bootstrap_admin_key(store, tmp_path)
    assert path == tmp_path / "admin-key"
    assert path.stat().st_mode & 0o777 == 0o600
    principal = await authenticate(store, path.read_text().strip())
    assert principal.role is Role.ADMIN and principal.tenant == "default"
    assert await bootstrap_admin_key(store, tmp_path) is None, "only on an empty store"


async def test_no_admin_key_is_stored_when_its_file_cannot_be_written(tmp_path: Path) -> None:
    store = MemoryStore()
    (tmp_path / "admin-key").mkdir()  # something in the way
    with pytest.raises(OSError):
        await bootstrap_admin_key(store, tmp_path)
    assert await store.count_keys() == 0, "the next start tries again instead of locking out"


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def get_key(self, key_id: str) -> ApiKey | None:
        self.reads += 1
        return await super().get_key(key_id)


async def test_wrong_secrets_for_a_known_key_do_not_each_read_the_store() -> None:
    # Every wrong secret for a known id re-read the store: unauthenticated DB amplification.
    store, cache = _CountingStore(), KeyCache(ttl=3600)
    key = await mint_key(store, "acme", Role.AGENT)
    await authenticate(store, key, cache)
    key_id = key.split("_")[1]
    before = store.reads
    for n in range(50):
        with pytest.raises(Unauthenticated):
            await authenticate(store, f"rf_{key_id}_{'x' * 41}{n:02d}", cache)
    assert store.reads - before <= 1, "one read again per key id and cache ttl, at most"


async def test_another_replicas_new_secret_works_at_once() -> None:
    store, cache = MemoryStore(), KeyCache(ttl=3600)
    old = await mint_key(store, "acme", Role.AGENT, name="Grace")
    await authenticate(store, old, cache)  # remembered with its old secret
    key_id = old.split("_")[1]
    _, new = await rotate_key(store, key_id, "another-replica")  # not through this cache
    principal = await authenticate(store, new, cache)
    assert principal.key_id == key_id and principal.name == "Grace"
