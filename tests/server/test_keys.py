"""API keys: minted once, stored as a digest, the first one handed to the operator safely."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfence.errors import InvalidRequest, Unauthenticated
from ringfence.service.keys import authenticate, bootstrap_admin_key, mint_key
from ringfence.store import MemoryStore, Role


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
