"""Access tokens and signed-URL signatures: pure logic, checked against the SDK's own code."""

from __future__ import annotations

import pytest
from e2b.sandbox.signature import get_signature

from ringfence.errors import InvalidRequest
from ringfence.server.e2b import tokens
from ringfence.server.e2b.control import _metadata_filter
from ringfence.server.e2b.tokens import (
    MAX_REMEMBERED,
    Grant,
    Grants,
    Purpose,
    expired,
    file_signature,
)

GRANT = Grant("acme", "0123456789abcdef", "g1", "sb1")


def test_a_token_opens_only_its_sandbox_and_purpose() -> None:
    grants = Grants()
    envd = grants.token(GRANT, Purpose.ENVD)
    assert grants.check(envd, "sb1", Purpose.ENVD) == GRANT
    assert grants.check(envd, "sb2", Purpose.ENVD) is None
    assert grants.check(envd, "sb1", Purpose.TRAFFIC) is None
    traffic = grants.token(GRANT, Purpose.TRAFFIC)
    assert traffic != envd and grants.check(traffic, "sb1", Purpose.TRAFFIC) == GRANT


@pytest.mark.parametrize("mutate", [
    lambda t: t.replace("acme", "globex", 1),            # another tenant's name
    lambda t: t.replace("0123456789abcdef", "f" * 16),   # another key's id
    lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),   # a flipped mac
    lambda t: t.rsplit(".", 1)[0],                       # no mac
    lambda t: "",
])  # fmt: skip
def test_a_changed_token_is_refused(mutate: object) -> None:
    grants = Grants()
    token = grants.token(GRANT, Purpose.ENVD)
    assert callable(mutate)
    assert grants.check(mutate(token), "sb1", Purpose.ENVD) is None


def test_another_servers_secret_mints_other_tokens() -> None:
    token = Grants().token(GRANT, Purpose.ENVD)
    assert Grants().check(token, "sb1", Purpose.ENVD) is None


@pytest.mark.parametrize("expiration", [None, 1_900_000_000])
@pytest.mark.parametrize("user", [None, "user"])
def test_signatures_match_the_sdks(expiration: int | None, user: str | None) -> None:
    grants = Grants()
    token = grants.token(GRANT, Purpose.ENVD)
    ours = file_signature(
        "/a b.txt", "read", user or "", token, str(expiration) if expiration else None
    )
    sdk = get_signature("/a b.txt", "read", user, token, None)
    if expiration is None:
        assert ours == sdk["signature"]
    found = grants.by_signature(
        "/a b.txt", "read", user or "", ours, str(expiration) if expiration else None
    )
    assert found == GRANT
    assert grants.by_signature("/a b.txt", "write", user or "", ours, None) is None
    grants.forget("sb1")
    assert grants.by_signature("/a b.txt", "read", user or "", ours, None) is None


def test_expiry() -> None:
    assert not expired(None) and not expired("99999999999")
    assert expired("1") and expired("soon")


def test_metadata_filter_undoes_e2bs_double_encoding() -> None:
    raw = "k=v%2520w%2526x%253D1&a%252Fb=c"  # what arrives once the query is decoded
    assert _metadata_filter(raw) == {"k": "v w&x=1", "a/b": "c"}
    assert _metadata_filter(None) == {}
    with pytest.raises(InvalidRequest):
        _metadata_filter("no-equals-sign")


def test_a_forged_signature_costs_at_most_the_remembered_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Signed URLs are unauthenticated: a miss hashes once per remembered grant, so the
    grants kept are bounded low enough that a miss stays cheap (~1.5-3 µs a hash)."""
    assert MAX_REMEMBERED <= 2048
    grants = Grants()
    for n in range(MAX_REMEMBERED + 10):
        grants.token(Grant("acme", "0123456789abcdef", "g1", f"sb{n}"), Purpose.ENVD)
    assert len(grants) == MAX_REMEMBERED
    assert Grant("acme", "0123456789abcdef", "g1", "sb0") not in grants.issued()  # oldest first
    hashed = 0
    real = tokens.file_signature

    def counted(path: str, operation: str, user: str, token: str, expiry: str | None) -> str:
        nonlocal hashed
        hashed += 1
        return real(path, operation, user, token, expiry)

    monkeypatch.setattr(tokens, "file_signature", counted)
    assert grants.by_signature("/home/user/x", "read", "user", "v1_AAAA", None) is None
    assert hashed == MAX_REMEMBERED
