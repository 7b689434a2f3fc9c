"""Keys are listed, revoked and rotated by admins (``/v1/keys``): a revoked key is refused
by every door (the native API, E2B's control plane, MCP, console sessions), on every
replica within seconds; a rotated key's old secret likewise. No answer shows a secret."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from ringfence.models import Role
from ringfence.service.keys import KEY_CACHE_SECONDS, mint_key
from ringfence.store import Store
from tests.console.conftest import sign_in
from tests.integration._attack_helpers import eventually
from tests.server.conftest import Api, _serving

pytestmark = pytest.mark.fakes  # logic: see tests/README.md, "Which backend"

_INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "test", "version": "1"}},
}  # fmt: skip
_BOUND = KEY_CACHE_SECONDS + 10  # how long another replica may take, with slack for CI


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _id(key: str) -> str:
    return key.split("_")[1]


async def _doors(
    client: httpx.AsyncClient, key: str, console: httpx.AsyncClient
) -> dict[str, object]:
    """The status each door answers ``key`` with (the console: its signed-in session)."""
    mcp = await client.post(
        "/mcp", json=_INITIALIZE,
        headers={**_bearer(key), "Accept": "application/json, text/event-stream"},
    )  # fmt: skip
    page = await console.get("/console", follow_redirects=False)
    signed_out = page.status_code == 303 and page.headers["location"] == "/console/login"
    return {
        "api": (await client.get("/v1/sandboxes", headers=_bearer(key))).status_code,
        "e2b": (await client.get("/sandboxes", headers={"X-API-KEY": key})).status_code,
        "mcp": mcp.status_code,
        "console": page.status_code if not signed_out else "signed out",
    }


@contextlib.asynccontextmanager
async def _browser(api: Api, key: str) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in to the console with ``key``."""
    async with httpx.AsyncClient(transport=api.transport, base_url="http://ringfence.test") as c:
        assert (await sign_in(c, key)).status_code == 303
        yield c


async def _admin(store: Store) -> dict[str, str]:
    return _bearer(await mint_key(store, "acme", Role.ADMIN, name="Ada (admin)"))


@pytest.mark.every_store
async def test_a_revoked_key_is_refused_by_every_door(api: Api) -> None:
    admin = await _admin(api.store)
    key = await mint_key(api.store, "acme", Role.APPROVER, "on-call", name="Grace")
    async with _browser(api, key) as console:
        assert await _doors(api.client, key, console) == {
            "api": 200, "e2b": 200, "mcp": 200, "console": 200,
        }, "control: every door lets it in"  # fmt: skip
        revoked = await api.client.post(f"/v1/keys/{_id(key)}/revoke", headers=admin)
        assert revoked.status_code == 200, revoked.text
        assert revoked.json()["revoked"] is True and revoked.json()["name"] == "Grace"
        assert await _doors(api.client, key, console) == {
            "api": 401, "e2b": 401, "mcp": 401, "console": "signed out",
        }  # fmt: skip
        again = await sign_in(console, key)
        assert again.status_code == 401, "a revoked key cannot sign in again"
    refused = await api.client.get("/v1/whoami", headers=_bearer(key))
    assert refused.json()["error"]["code"] == "unauthenticated"
    assert "revoked" in refused.json()["error"]["message"]
    twice = await api.client.post(f"/v1/keys/{_id(key)}/revoke", headers=admin)
    assert twice.json()["revoked_at"] == revoked.json()["revoked_at"], "revoked once, for good"
    rotate = await api.client.post(f"/v1/keys/{_id(key)}/rotate", headers=admin)
    assert rotate.status_code == 409 and rotate.json()["error"]["code"] == "conflict"
    audit = await api.client.get("/v1/audit", params={"action": "key.revoke"}, headers=admin)
    [record] = audit.json()
    admin_id = (await api.client.get("/v1/whoami", headers=admin)).json()["key_id"]
    assert (record["actor"], record["target"]) == (admin_id, f"key:{_id(key)}")
    assert record["details"]["name"] == "Grace"


@pytest.mark.every_store
async def test_a_rotated_key_has_a_new_secret_and_the_old_one_is_refused(api: Api) -> None:
    admin = await _admin(api.store)
    old = await mint_key(api.store, "acme", Role.APPROVER, name="Grace")
    async with _browser(api, old) as console:
        rotated = await api.client.post(f"/v1/keys/{_id(old)}/rotate", headers=admin)
        assert rotated.status_code == 200, rotated.text
        new = rotated.json()["api_key"]
        assert new != old and _id(new) == _id(old) and rotated.json()["rotated_at"]
        assert await _doors(api.client, old, console) == {
            "api": 401, "e2b": 401, "mcp": 401, "console": "signed out",
        }, "the old secret, and the session it opened, are refused"  # fmt: skip
    me = (await api.client.get("/v1/whoami", headers=_bearer(new))).json()
    assert (me["key_id"], me["name"], me["role"]) == (_id(old), "Grace", "approver")
    async with _browser(api, new) as console:
        assert (await console.get("/console")).status_code == 200
        assert "Grace" in (await console.get("/console")).text, "the console names the key"


async def test_only_an_admin_of_the_tenant_manages_its_keys(api: Api) -> None:
    admin = await _admin(api.store)
    approver = await mint_key(api.store, "acme", Role.APPROVER)
    theirs = await mint_key(api.store, "globex", Role.AGENT)
    for headers in (api.acme, _bearer(approver)):
        for method, path in (("GET", "/v1/keys"), ("POST", f"/v1/keys/{_id(approver)}/revoke"),
                             ("POST", f"/v1/keys/{_id(approver)}/rotate")):  # fmt: skip
            answer = await api.client.request(method, path, headers=headers)
            assert answer.status_code == 403, (path, answer.text)
            assert answer.json()["error"]["code"] == "forbidden"
    for key_id in (_id(theirs), "0" * 16, "not-a-key-id", "x" * 64):
        for action in ("revoke", "rotate"):
            answer = await api.client.post(f"/v1/keys/{key_id}/{action}", headers=admin)
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]["code"] == "not_found"
    assert (await api.client.get("/v1/whoami", headers=_bearer(theirs))).status_code == 200
    assert (await api.client.get("/v1/keys", headers={})).status_code == 401


@pytest.mark.every_store
async def test_the_list_shows_names_and_never_a_secret(api: Api) -> None:
    admin_key = await mint_key(api.store, "acme", Role.ADMIN, name="Ada")
    named = await mint_key(api.store, "acme", Role.AGENT, "ci", name="build bot")
    listed = await api.client.get("/v1/keys", headers=_bearer(admin_key))
    assert listed.status_code == 200
    by_id = {k["id"]: k for k in listed.json()}
    assert by_id[_id(named)]["name"] == "build bot" and by_id[_id(admin_key)]["name"] == "Ada"
    assert {k["tenant"] for k in listed.json()} == {"acme"}, "only the admin's tenant"
    text = listed.text
    for key in (admin_key, named, api.acme_key):
        stored = await api.store.get_key(_id(key))
        assert stored is not None
        assert key.split("_", 2)[2] not in text and stored.secret_hash not in text
    assert set(by_id[_id(named)]) == {
        "id", "tenant", "role", "name", "description", "created_at", "rotated_at",
        "revoked_at", "revoked",
    }  # fmt: skip


async def test_another_replica_refuses_a_revoked_key_within_seconds(
    local_host: object, postgres_database: str
) -> None:
    """Two replicas on one PostgreSQL database, each remembering keys it read: a revocation
    through one reaches the other (and the console session there) within the bound."""
    from ringfence.store.sql import SqlStore

    first, second = await SqlStore.open(postgres_database), await SqlStore.open(postgres_database)
    try:
        async with _serving(local_host, first) as one, _serving(local_host, second) as two:
            admin = await _admin(first)
            key = await mint_key(first, "acme", Role.APPROVER, name="Grace")
            async with _browser(two, key) as console:
                assert await _doors(two.client, key, console) == {
                    "api": 200, "e2b": 200, "mcp": 200, "console": 200,
                }, "the other replica has read (and remembers) the key"  # fmt: skip
                answer = await one.client.post(f"/v1/keys/{_id(key)}/revoke", headers=admin)
                assert answer.status_code == 200

                async def refused_everywhere() -> bool:
                    doors = await _doors(two.client, key, console)
                    return doors == {"api": 401, "e2b": 401, "mcp": 401, "console": "signed out"}

                await eventually(refused_everywhere, timeout=_BOUND, what="the revocation")
    finally:
        await first.aclose()
        await second.aclose()
