"""Knowing a sandbox id is not enough: sandbox traffic needs the access token the control
plane handed out, and another tenant's key finds nothing. Each attack is driven through the
unmodified SDK, which must raise its own authentication or not-found exception."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import httpx
import pytest
from e2b_code_interpreter import Sandbox as CodeSandbox
from packaging.version import Version

from e2b import (
    AuthenticationException,
    ConnectionConfig,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
)
from tests.e2b.conftest import E2bServer


@pytest.fixture(scope="module")
def victim(e2b_server: E2bServer) -> Iterator[CodeSandbox]:
    """Tenant default's sandbox, which the attacks aim at."""
    with CodeSandbox.create(timeout=600) as sandbox:
        sandbox.files.write("/home/user/secret.txt", "s3cret")
        yield sandbox


def _forged(
    cls: type[Sandbox], sandbox_id: str, token: str | None, traffic: str | None = None
) -> Sandbox:
    """A handle on ``sandbox_id`` with the tokens an attacker has, built as the SDK builds
    its own (``Sandbox._create`` / ``connect``)."""
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
    if token is not None:
        headers["X-Access-Token"] = token
    return cls(
        sandbox_id=sandbox_id,
        sandbox_domain=None,
        envd_version=Version("0.6.4"),
        envd_access_token=token,
        traffic_access_token=traffic,
        connection_config=ConnectionConfig(extra_sandbox_headers=headers),
    )


@pytest.mark.parametrize("user", ["user", "root"])  # root inside too (issue 16)
@pytest.mark.parametrize("token", [None, "", "default.0000000000000000.AAAA", "garbage"])
def test_envd_without_the_right_token_is_an_authentication_error(
    victim: CodeSandbox, token: str | None, user: Literal["user", "root"]
) -> None:
    forged = _forged(Sandbox, victim.sandbox_id, token)
    with pytest.raises(AuthenticationException):
        forged.commands.run("cat /home/user/secret.txt", user=user)
    with pytest.raises(AuthenticationException):
        forged.files.read("/home/user/secret.txt", user=user)
    with pytest.raises(AuthenticationException):
        forged.files.write("/home/user/planted.txt", "x", user=user)
    with pytest.raises(AuthenticationException):
        forged.files.list("/home/user", user=user)
    assert not victim.files.exists("/home/user/planted.txt")


@pytest.mark.parametrize("user", ["user", "root"])
def test_another_sandboxs_token_does_not_open_this_one(
    e2b_server: E2bServer, victim: CodeSandbox, user: Literal["user", "root"]
) -> None:
    with Sandbox.create() as mine:
        forged = _forged(Sandbox, victim.sandbox_id, mine._envd_access_token)
        with pytest.raises(AuthenticationException):
            forged.commands.run("cat /home/user/secret.txt", user=user)


def test_code_interpreter_without_the_right_tokens_is_refused(victim: CodeSandbox) -> None:
    forged = _forged(CodeSandbox, victim.sandbox_id, "wrong", "wrong-traffic")
    assert isinstance(forged, CodeSandbox)
    for attempt in (
        lambda: forged.run_code("open('/home/user/secret.txt').read()"),
        forged.create_code_context,
        forged.list_code_contexts,
    ):
        with pytest.raises(SandboxException, match="401"):
            attempt()
    # The traffic token alone opens the code interpreter (its /contexts calls carry only it)
    # but not envd.
    traffic_only = _forged(CodeSandbox, victim.sandbox_id, None, victim.traffic_access_token)
    assert isinstance(traffic_only, CodeSandbox)
    assert traffic_only.run_code("1 + 1").text == "2"
    with pytest.raises(AuthenticationException):
        traffic_only.commands.run("true")


def test_raw_requests_without_a_token_get_e2b_shaped_401s(
    e2b_server: E2bServer, victim: CodeSandbox
) -> None:
    headers = {"E2b-Sandbox-Id": victim.sandbox_id, "E2b-Sandbox-Port": "49983"}
    answer = httpx.get(f"{e2b_server.url}/files", params={"path": "secret.txt"}, headers=headers)
    assert answer.status_code == 401 and answer.json()["code"] == 401
    rpc = httpx.post(
        f"{e2b_server.url}/filesystem.Filesystem/ListDir", json={"path": "/"}, headers=headers
    )
    assert rpc.status_code == 401 and rpc.json()["code"] == "unauthenticated"
    no_id = httpx.get(f"{e2b_server.url}/health", headers={"E2b-Sandbox-Port": "49983"})
    assert no_id.status_code == 401
    other_port = httpx.get(f"{e2b_server.url}/", headers={**headers, "E2b-Sandbox-Port": "8080"})
    assert other_port.status_code == 404 and "8080" in other_port.json()["message"]


def test_another_tenants_key_finds_nothing(e2b_server: E2bServer, victim: CodeSandbox) -> None:
    config = {"api_key": e2b_server.other_key}
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(victim.sandbox_id, **config)  # type: ignore[arg-type]
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(victim.sandbox_id, **config)  # type: ignore[arg-type]
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(victim.sandbox_id, 1, **config)  # type: ignore[arg-type]
    assert Sandbox.kill(victim.sandbox_id, **config) is False  # type: ignore[arg-type]
    listed = Sandbox.list(**config).next_items()  # type: ignore[arg-type]
    assert victim.sandbox_id not in {s.sandbox_id for s in listed}
    assert victim.is_running() and victim.files.read("/home/user/secret.txt") == "s3cret"


def test_a_token_handed_to_another_tenant_does_not_cross(
    e2b_server: E2bServer, victim: CodeSandbox
) -> None:
    """Tenant globex's token for its own sandbox, aimed at tenant default's sandbox."""
    theirs = Sandbox.create(api_key=e2b_server.other_key)
    try:
        forged = _forged(Sandbox, victim.sandbox_id, theirs._envd_access_token)
        with pytest.raises(AuthenticationException):
            forged.files.read("/home/user/secret.txt")
        assert theirs.commands.run("echo mine").stdout == "mine\n"
    finally:
        theirs.kill()


def test_control_plane_needs_a_valid_key(e2b_server: E2bServer) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="rf_0000000000000000_" + "A" * 43)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="not-a-key").next_items()
    answer = httpx.post(f"{e2b_server.url}/v2/sandboxes", json={"templateID": "base"})
    assert answer.status_code == 401 and set(answer.json()) == {"code", "message"}


def test_after_kill_its_token_reaches_nothing(e2b_server: E2bServer) -> None:
    from e2b import SandboxNotRunningException

    sbx = Sandbox.create()
    sbx.kill()
    with pytest.raises(SandboxNotRunningException):
        sbx.commands.run("true")
    assert not sbx.is_running()


def test_bodies_are_bounded_through_this_door_too(
    e2b_server: E2bServer, victim: CodeSandbox
) -> None:
    """Only uploads stream to the sandbox; any other body past the server's limit is
    refused before it is read whole (the native API's 4 MiB)."""
    headers = {
        "E2b-Sandbox-Id": victim.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": victim._envd_access_token or "",
        "Content-Type": "application/json",
    }
    huge = b'{"path": "' + b"a" * (5 << 20) + b'"}'
    rpc = httpx.post(
        f"{e2b_server.url}/filesystem.Filesystem/ListDir", content=huge, headers=headers
    )
    assert rpc.status_code == 413
    code = httpx.post(
        f"{e2b_server.url}/execute",
        content=huge,
        headers={**headers, "E2b-Sandbox-Port": "49999"},
    )
    assert code.status_code == 413
    control = httpx.post(
        f"{e2b_server.url}/v2/sandboxes",
        content=huge,
        headers={"X-API-KEY": e2b_server.key, "Content-Type": "application/json"},
    )
    assert control.status_code == 413
    assert victim.is_running()
