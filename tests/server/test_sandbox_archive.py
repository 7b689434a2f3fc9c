"""A sandbox's directory as a tar stream on real sandboxes: the content round-trips,
a large tree arrives in pieces over real HTTP, and links pointing out of the directory
(or out of the sandbox) stay links: nothing outside it is in the archive."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from tests.server.conftest import Api

pytestmark = pytest.mark.integration
MIB = 1 << 20


async def _create(api: Api) -> str:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json={"timeout": 300})
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


async def _python(api: Api, sandbox_id: str, code: str) -> None:
    ran = await api.client.post(f"/v1/sandboxes/{sandbox_id}/code/execute", headers=api.acme,
                                json={"code": code}, timeout=120)  # fmt: skip
    assert ran.status_code == 200, ran.text
    lines = [json.loads(line) for line in ran.text.splitlines()]
    assert not [line for line in lines if line["type"] == "error"], lines


_TREE = """
import os
os.makedirs('/home/user/proj/src/deep', exist_ok=True)
open('/home/user/proj/src/deep/a.txt', 'w').write('alpha')
open('/home/user/proj/b.bin', 'wb').write(bytes(range(256)) * 64)
open('/home/user/secret.txt', 'w').write('outside the directory')
os.symlink('../secret.txt', '/home/user/proj/up-link')
os.symlink('/etc/passwd', '/home/user/proj/abs-link')
os.symlink('/home/user', '/home/user/proj/home-link')
os.mkfifo('/home/user/proj/fifo')
"""


async def test_a_directory_round_trips_and_links_out_of_it_stay_links(api: Api) -> None:
    sandbox_id = await _create(api)
    await _python(api, sandbox_id, _TREE)
    got = await api.client.get(f"/v1/sandboxes/{sandbox_id}/files/archive",
                               params={"path": "proj"}, headers=api.acme)  # fmt: skip
    assert got.status_code == 200, got.text
    assert got.headers["content-type"] == "application/x-tar"
    assert b"outside the directory" not in got.content
    assert b"root:x:0:0" not in got.content
    tar = _tar(got.content)
    members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"src", "src/deep", "src/deep/a.txt", "b.bin", "up-link",
                            "abs-link", "home-link"}  # fmt: skip
    assert members["up-link"].issym() and members["up-link"].linkname == "../secret.txt"
    assert members["abs-link"].linkname == "/etc/passwd"
    assert members["home-link"].issym()
    a_txt = tar.extractfile("src/deep/a.txt")
    assert a_txt is not None and a_txt.read() == b"alpha"
    b_bin = tar.extractfile("b.bin")
    assert b_bin is not None and b_bin.read() == bytes(range(256)) * 64

    theirs = await api.client.get(f"/v1/sandboxes/{sandbox_id}/files/archive",
                                  params={"path": "proj"}, headers=api.globex)  # fmt: skip
    assert theirs.status_code == 404
    missing = await api.client.get(f"/v1/sandboxes/{sandbox_id}/files/archive",
                                   params={"path": "nope"}, headers=api.acme)  # fmt: skip
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_a_large_tree_streams(live: Api) -> None:
    created = await live.client.post("/v1/sandboxes", headers=live.acme,
                                     json={"timeout": 300, "limits": {"disk": "512M"}})  # fmt: skip
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    await _python(live, sandbox_id, "import os\n"
                  "os.makedirs('/home/user/big/many', exist_ok=True)\n"
                  "open('/home/user/big/blob', 'wb').write(os.urandom(64 << 20))\n"
                  "for i in range(2000):\n"
                  "    open(f'/home/user/big/many/{i}', 'w').write(str(i))\n")  # fmt: skip
    pieces = 0
    total = 0
    buffer = io.BytesIO()
    async with live.client.stream("GET", f"/v1/sandboxes/{sandbox_id}/files/archive",
                                  params={"path": "big"}, headers=live.acme) as answer:  # fmt: skip
        assert answer.status_code == 200
        async for chunk in answer.aiter_raw():
            pieces += 1
            total += len(chunk)
            buffer.write(chunk)
    assert pieces > 16, "it arrived as it was produced, not as one body"
    assert total > 64 * MIB
    tar = _tar(buffer.getvalue())
    names = tar.getnames()
    assert "blob" in names and len([n for n in names if n.startswith("many/")]) == 2000
    assert tar.getmember("blob").size == 64 * MIB


def _tar(data: bytes) -> tarfile.TarFile:
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:")
