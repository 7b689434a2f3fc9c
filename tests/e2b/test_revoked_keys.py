"""E2B's door refuses a revoked key: its control plane (the API key) and the sandbox traffic
(the access token handed to that key), through the unmodified SDK."""

from __future__ import annotations

import httpx
import pytest

from e2b import AuthenticationException, Sandbox
from tests.e2b.conftest import E2bServer


def test_a_revoked_key_and_its_sandbox_tokens_are_refused(e2b_server: E2bServer) -> None:
    key = e2b_server.mint_key("agent")
    sandbox = Sandbox.create(api_key=key, timeout=120)
    try:
        assert sandbox.commands.run("echo hi").stdout == "hi\n", "control: the key works"
        assert sandbox.files.read("/etc/hostname") is not None
        url = sandbox.download_url("/etc/hostname")
        assert httpx.get(url).status_code == 200, "control: the signed URL works"
        revoked = httpx.post(
            f"{e2b_server.url}/v1/keys/{key.split('_')[1]}/revoke",
            headers={"Authorization": f"Bearer {e2b_server.key}"},
        )
        assert revoked.status_code == 200, revoked.text
        with pytest.raises(AuthenticationException):
            Sandbox.list(api_key=key).next_items()
        with pytest.raises(AuthenticationException):
            Sandbox.create(api_key=key, timeout=60)
        with pytest.raises(AuthenticationException):
            Sandbox.connect(sandbox.sandbox_id, api_key=key)
        with pytest.raises(AuthenticationException, match="revoked"):
            sandbox.commands.run("echo hi")
        with pytest.raises(AuthenticationException, match="revoked"):
            sandbox.files.read("/etc/hostname")
        assert httpx.get(url).status_code == 401, "the signed URL it was handed, too"
    finally:
        Sandbox.kill(sandbox.sandbox_id, api_key=e2b_server.key)


def test_a_rotated_keys_sandbox_tokens_and_signed_urls_are_refused(e2b_server: E2bServer) -> None:
    # Rotation is the answer to a leak: what the old secret was handed must end with it.
    key = e2b_server.mint_key("agent")
    sandbox = Sandbox.create(api_key=key, timeout=120)
    try:
        assert sandbox.commands.run("echo hi").stdout == "hi\n", "control: the token works"
        url = sandbox.download_url("/etc/hostname")
        assert httpx.get(url).status_code == 200, "control: the signed URL works"
        rotated = httpx.post(
            f"{e2b_server.url}/v1/keys/{key.split('_')[1]}/rotate",
            headers={"Authorization": f"Bearer {e2b_server.key}"},
        )
        assert rotated.status_code == 200, rotated.text
        with pytest.raises(AuthenticationException, match="rotated"):
            sandbox.commands.run("echo hi")
        with pytest.raises(AuthenticationException, match="rotated"):
            sandbox.files.read("/etc/hostname")
        refused = httpx.get(url)
        assert refused.status_code == 401 and "rotated" in refused.text, "its signed URL, too"
        again = Sandbox.connect(sandbox.sandbox_id, api_key=rotated.json()["api_key"])
        assert again.commands.run("echo hi").stdout == "hi\n", "the new secret's token works"
    finally:
        Sandbox.kill(sandbox.sandbox_id, api_key=e2b_server.key)
