"""``sbx.files`` through the unmodified E2B SDK: ``/files`` uploads and downloads (multipart
split per file by the server, octet-stream streamed), the filesystem service, watches, and
signed URLs."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from e2b.sandbox.filesystem.filesystem import WriteEntry

from e2b import (
    FileNotFoundException,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    Sandbox,
    SandboxException,
)
from tests.e2b.conftest import E2bServer, audit_records


@pytest.fixture(scope="module")
def sbx(e2b_server: E2bServer) -> Iterator[Sandbox]:
    with Sandbox.create(timeout=600) as sandbox:
        yield sandbox


def test_write_then_read_text_and_bytes(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/a.txt", "hello")
    assert info.path == "/home/user/a.txt" and info.name == "a.txt"
    assert sbx.files.read("/home/user/a.txt") == "hello"
    blob = bytes(range(256)) * 4
    sbx.files.write("rel/blob.bin", blob)  # relative: against /home/user
    assert sbx.files.read("/home/user/rel/blob.bin", format="bytes") == blob
    assert b"".join(sbx.files.read("rel/blob.bin", format="stream")) == blob


def test_write_files_writes_each(sbx: Sandbox) -> None:
    written = sbx.files.write_files(
        [WriteEntry(path="many/one.txt", data="1"), WriteEntry(path="/tmp/two.txt", data=b"2")]
    )
    assert [w.path for w in written] == ["/home/user/many/one.txt", "/tmp/two.txt"]
    assert sbx.files.read("many/one.txt") == "1" and sbx.files.read("/tmp/two.txt") == "2"


def test_a_file_larger_than_the_request_limit_streams_through(sbx: Sandbox) -> None:
    big = os.urandom(6 << 20)  # the server refuses buffered bodies above 4 MiB
    sbx.files.write("big.bin", big)  # multipart
    assert sbx.files.read("big.bin", format="bytes") == big
    sbx.files.write("big2.bin", io.BytesIO(big))  # a file-like: octet-stream
    assert sbx.commands.run("cmp big.bin big2.bin").exit_code == 0


def test_list_exists_info_make_dir_rename_remove(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("tree/sub") is True
    assert sbx.files.make_dir("tree/sub") is False, "it exists"
    sbx.files.write("tree/f.txt", "abc")
    names = {(e.name, e.type) for e in sbx.files.list("tree")}
    assert names == {("sub", FileType.DIR), ("f.txt", FileType.FILE)}
    deep = {e.path for e in sbx.files.list("tree", depth=2)}
    assert "/home/user/tree/sub" in deep
    info = sbx.files.get_info("tree/f.txt")
    assert info.size == 3 and info.type is FileType.FILE and info.path == "/home/user/tree/f.txt"
    assert sbx.files.exists("tree/f.txt") and not sbx.files.exists("tree/nope")
    moved = sbx.files.rename("tree/f.txt", "tree/g.txt")
    assert moved.path == "/home/user/tree/g.txt" and sbx.files.read("tree/g.txt") == "abc"
    sbx.files.remove("tree")
    assert not sbx.files.exists("tree")


def test_missing_files_raise_file_not_found(sbx: Sandbox) -> None:
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/home/user/missing.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.get_info("/home/user/missing.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.list("/home/user/missing-dir")


def test_a_write_to_the_root_stays_in_the_sandbox(sbx: Sandbox) -> None:
    """The root is writable (an overlay per sandbox, as E2B's is the sandbox's own disk)
    by root inside, as E2B's: what is written there is the sandbox's, never the host's or
    the template's. The sandbox user may not change the system."""
    with pytest.raises(SandboxException, match="Permission denied"):
        sbx.files.write("/usr/planted-by-e2b-test", "x")
    sbx.files.write("/usr/planted-by-e2b-test", "x", user="root")
    assert sbx.files.read("/usr/planted-by-e2b-test") == "x"
    assert not os.path.exists("/usr/planted-by-e2b-test")
    with Sandbox.create() as other:
        assert not other.files.exists("/usr/planted-by-e2b-test")


def test_a_write_the_sandbox_cannot_make_is_refused(sbx: Sandbox) -> None:
    sbx.files.write("blocker", "a file, not a directory")
    with pytest.raises(SandboxException):
        sbx.files.write("blocker/inside.txt", "x")


def _events_until(handle: object, done: Callable[[list[FilesystemEvent]], bool]) -> list:
    """The watcher's events, polled until ``done`` says so (10 s at most)."""
    deadline = time.monotonic() + 10
    events: list[FilesystemEvent] = []
    while time.monotonic() < deadline and not done(events):
        events += handle.get_new_events()  # type: ignore[attr-defined]
        time.sleep(0.05)
    return events


def test_watch_dir_reports_changes(sbx: Sandbox) -> None:
    sbx.files.make_dir("watched")
    handle = sbx.files.watch_dir("watched")
    try:
        sbx.files.write("watched/new.txt", "x")
        events = _events_until(handle, lambda got: any(e.name == "new.txt" for e in got))
        kinds = {e.type for e in events if e.name == "new.txt"}
        assert kinds & {FilesystemEventType.CREATE, FilesystemEventType.WRITE}
    finally:
        handle.stop()


def test_a_write_is_the_files_own_write_event(sbx: Sandbox) -> None:
    """As envd writes in place: a WRITE of the file itself, no temporary file beside it
    (``.<name>.upload-<hex>`` and a rename's CREATE, before)."""
    sbx.files.make_dir("watched-write")
    sbx.files.write("watched-write/log.txt", "first")
    handle = sbx.files.watch_dir("watched-write")
    try:
        sbx.files.write("watched-write/log.txt", "second, longer")
        events = _events_until(
            handle, lambda got: any(e.type is FilesystemEventType.WRITE for e in got)
        )
        assert {e.name for e in events} == {"log.txt"}, events
        assert FilesystemEventType.WRITE in {e.type for e in events}
        assert FilesystemEventType.CREATE not in {e.type for e in events}, "it existed"
    finally:
        handle.stop()
    assert sbx.files.read("watched-write/log.txt") == "second, longer"


def test_removing_what_is_not_there_is_a_no_op(sbx: Sandbox) -> None:
    """envd's Remove is ``os.RemoveAll``: cleanup code calls it without looking first."""
    sbx.files.remove("/home/user/never-there")
    sbx.files.remove("never/there/either")
    assert not sbx.files.exists("never-there")


def test_a_deep_listing_is_in_envds_order(sbx: Sandbox) -> None:
    """Go's ``filepath.WalkDir``: by name, each directory's contents right after it."""
    for path in ("ordered/b.txt", "ordered/a/z.txt", "ordered/a/y/x.txt", "ordered/c/w.txt"):
        sbx.files.write(path, "x")
    listed = [e.path.removeprefix("/home/user/ordered/") for e in sbx.files.list("ordered", 2)]
    assert listed == ["a", "a/y", "a/z.txt", "b.txt", "c", "c/w.txt"]


def test_signed_urls_download_and_upload_without_any_header(sbx: Sandbox) -> None:
    sbx.files.write("shared.txt", "for download")
    url = sbx.download_url("/home/user/shared.txt")
    assert "signature=v1_" in url
    assert httpx.get(url).text == "for download"
    upload = sbx.upload_url("/home/user/uploaded.txt")
    answer = httpx.post(upload, files={"file": ("ignored-name", b"via url")})
    assert answer.status_code == 200 and answer.json()[0]["path"] == "/home/user/uploaded.txt"
    assert sbx.files.read("uploaded.txt") == "via url"
    expiring = sbx.download_url("/home/user/shared.txt", use_signature_expiration=60)
    assert httpx.get(expiring).text == "for download"


def test_signed_urls_are_bound_to_path_operation_and_time(sbx: Sandbox) -> None:
    sbx.files.write("secret.txt", "s")
    url = sbx.download_url("/home/user/shared-x.txt")
    tampered = url.replace("shared-x.txt", "secret.txt")
    assert httpx.get(tampered).status_code == 401
    as_upload = sbx.download_url("/home/user/secret.txt")  # a read signature used to write
    assert httpx.post(as_upload, files={"file": ("f", b"overwrite")}).status_code == 401
    expired = sbx.download_url("/home/user/secret.txt", use_signature_expiration=-10)
    assert httpx.get(expired).status_code == 401
    forged = url.split("signature=")[0] + "signature=v1_AAAA"
    assert httpx.get(forged).status_code == 401
    assert sbx.files.read("secret.txt") == "s"


def test_uploads_are_on_the_audit_record(e2b_server: E2bServer, sbx: Sandbox) -> None:
    sbx.files.write("audited-upload.txt", "x")
    records = audit_records(
        e2b_server, f"sandbox:{sbx.sandbox_id}", "sandbox.write_file", "audited-upload"
    )
    assert "audited-upload.txt" in str([r["details"] for r in records])


def test_gzip_uploads_are_accepted(sbx: Sandbox) -> None:
    sbx.files.write("gz.txt", "zipped on the wire", gzip=True)
    assert sbx.files.read("gz.txt") == "zipped on the wire"


def test_file_metadata_is_stored_and_returned_as_envd_does(sbx: Sandbox) -> None:
    """``user.e2b.*`` extended attributes: set by an upload's metadata (keys lowercased),
    returned by the write, ``get_info``, ``list`` and ``rename``; an upload replaces the set."""
    info = sbx.files.write("meta.txt", io.BytesIO(b"m"), metadata={"Author": "ann", "k": "v"})
    assert info.path == "/home/user/meta.txt" and sbx.files.read("meta.txt") == "m"
    assert info.metadata == {"author": "ann", "k": "v"}
    assert sbx.files.get_info("meta.txt").metadata == {"author": "ann", "k": "v"}
    listed = {e.name: e.metadata for e in sbx.files.list("/home/user")}
    assert listed["meta.txt"] == {"author": "ann", "k": "v"}
    moved = sbx.files.rename("meta.txt", "meta2.txt")
    assert moved.metadata == {"author": "ann", "k": "v"}
    many = sbx.files.write_files(
        [WriteEntry(path="m/a.txt", data="a"), WriteEntry(path="m/b.txt", data="b")],
        metadata={"batch": "1"},
    )
    assert [w.metadata for w in many] == [{"batch": "1"}, {"batch": "1"}]
    replaced = sbx.files.write("meta2.txt", "again", metadata={"k": "w"})
    assert replaced.metadata == {"k": "w"}, "the whole set is replaced"
    cleared = sbx.files.write("meta2.txt", "plain")
    assert cleared.metadata is None and sbx.files.get_info("meta2.txt").metadata is None
    probe = "import os; print(os.getxattr('m/a.txt', 'user.e2b.batch').decode())"
    assert sbx.commands.run(f'python3 -c "{probe}"').stdout == "1\n", "an xattr, as envd's"


_PAGE = "<html><script>fetch('/console')</script></html>"
_INERT = {
    "content-type": "application/octet-stream",
    "content-disposition": "attachment",
    "x-content-type-options": "nosniff",
    "content-security-policy": "sandbox",
}


def test_an_html_file_downloads_as_an_inert_attachment(sbx: Sandbox) -> None:
    """An approver opening a download link must not run the sandbox's page on the server's
    origin (where the approval console lives)."""
    assert sbx.commands.run(f"printf '%s' \"{_PAGE}\" > page.html").exit_code == 0
    signed = httpx.get(sbx.download_url("/home/user/page.html"))
    by_token = httpx.get(
        f"{sbx.envd_api_url}/files",
        params={"path": "/home/user/page.html"},
        headers={
            "X-Access-Token": sbx._envd_access_token or "",
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "E2b-Sandbox-Port": "49983",
        },
    )
    for answer in (signed, by_token):
        assert answer.status_code == 200 and answer.text == _PAGE
        assert {name: answer.headers.get(name) for name in _INERT} == _INERT
    assert sbx.files.read("page.html") == _PAGE


def test_a_refused_multipart_upload_is_marked_as_the_sandboxs_word(sbx: Sandbox) -> None:
    sbx.files.write("not-a-dir", "a file")
    answer = httpx.post(sbx.upload_url("/home/user/not-a-dir/x"), files={"file": ("f", b"x")})
    assert answer.status_code >= 400
    assert answer.headers.get("ringfence-origin") == "sandbox"
    assert answer.headers.get("x-content-type-options") == "nosniff"


def _by_token(sbx: Sandbox, **params: str) -> httpx.Response:
    return httpx.get(
        f"{sbx.envd_api_url}/files",
        params=params,
        headers={
            "X-Access-Token": sbx._envd_access_token or "",
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "E2b-Sandbox-Port": "49983",
        },
    )


def test_a_download_keeps_the_user_then_the_sandbox_then_the_path(e2b_server: E2bServer) -> None:
    """A download with no ``path`` is refused for the path last: another user first (403,
    the host's words), then a sandbox that is gone (not found), only then the path (400)."""
    doomed = Sandbox.create()
    try:
        as_bob = _by_token(doomed, username="bob")
        assert as_bob.status_code == 403
        assert "a sandbox has the users 'user' and 'root' only" in as_bob.text
        no_path = _by_token(doomed)
        assert no_path.status_code == 400 and "path" in no_path.json()["message"]
    finally:
        doomed.kill()
    gone = _by_token(doomed)
    assert gone.status_code != 400 and "not found" in gone.json()["message"]
