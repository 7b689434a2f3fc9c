"""Volumes end to end on real sandboxes: create, list, info, delete, files without a
sandbox, mounted into sandboxes (read-write and read-only, shared between two, kept across
sandboxes), the quota, and what another tenant can do with them (nothing)."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from tests.server._envd import run
from tests.server.conftest import Api

pytestmark = pytest.mark.integration
OCTETS = {"content-type": "application/octet-stream"}
MiB = 1 << 20


async def _volume(api: Api, name: str = "data", **spec: object) -> dict[str, Any]:
    created = await api.client.post("/v1/volumes", headers=api.acme, json={"name": name, **spec})
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    return body


async def _sandbox(api: Api, **spec: object) -> str:
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json=spec, timeout=60)
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


async def _sh(api: Api, sandbox_id: str, script: str, user: str | None = None) -> tuple[int, str]:
    """``sh -c script`` in the sandbox (as ``user``): its exit code and its output."""
    ran = await run(
        api.client, api.acme, sandbox_id, ["sh", "-c", f"exec 2>&1; {script}"], user=user
    )
    assert ran.error is None, ran
    return int(ran.end.get("exitCode", 0)), ran.stdout


async def _put(api: Api, volume: str, path: str, data: bytes, **params: object) -> Any:
    return await api.client.put(
        f"/v1/volumes/{volume}/files", params={"path": path, **params},
        headers={**api.acme, **OCTETS}, content=data,
    )  # fmt: skip


async def test_a_volume_is_created_listed_described_and_deleted(api: Api) -> None:
    made = await _volume(api, quota_bytes=64 * MiB)
    assert (
        made["name"] == "data" and made["quota_bytes"] == 64 * MiB and made["id"].startswith("vo")
    )
    again = await api.client.post("/v1/volumes", headers=api.acme, json={"name": "data"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "volume_exists"
    listed = await api.client.get("/v1/volumes", headers=api.acme)
    assert [v["id"] for v in listed.json()] == [made["id"]]
    for ref in ("data", made["id"]):
        info = await api.client.get(f"/v1/volumes/{ref}", headers=api.acme)
        assert info.status_code == 200 and 0 < info.json()["used_bytes"] < 64 * MiB
    gone = await api.client.delete("/v1/volumes/data", headers=api.acme)
    assert gone.status_code == 204
    missing = await api.client.get("/v1/volumes/data", headers=api.acme)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "volume_not_found"


async def test_quotas_have_a_default_and_a_ceiling(api: Api) -> None:
    made = await _volume(api)
    assert made["quota_bytes"] == api.services.config.volume_default_bytes
    ceiling = api.services.config.volume_max_bytes
    above = await api.client.post(
        "/v1/volumes", headers=api.acme, json={"name": "big", "quota_bytes": ceiling + 1}
    )
    assert above.status_code == 400 and above.json()["error"]["code"] == "invalid_request"


async def test_files_are_written_read_listed_and_removed_without_a_sandbox(api: Api) -> None:
    await _volume(api, quota_bytes=16 * MiB)
    written = await _put(api, "data", "/a/b/c.txt", b"hello")
    assert written.status_code == 200, written.text
    assert written.json()["uid"] == 1000 and written.json()["size"] == 5
    read = await api.client.get("/v1/volumes/data/files", params={"path": "a/b/c.txt"},
                                headers=api.acme)  # fmt: skip
    assert read.content == b"hello"
    listed = await api.client.get("/v1/volumes/data/dir", params={"path": "/", "depth": 3},
                                  headers=api.acme)  # fmt: skip
    assert [e["path"] for e in listed.json() if e["name"] != "lost+found"] == [
        "/a", "/a/b", "/a/b/c.txt",
    ]  # fmt: skip
    removed = await api.client.delete("/v1/volumes/data/files", params={"path": "/a"},
                                      headers=api.acme)  # fmt: skip
    assert removed.status_code == 204
    missing = await api.client.get("/v1/volumes/data/stat", params={"path": "/a"},
                                   headers=api.acme)  # fmt: skip
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_an_upload_past_the_quota_is_507_and_leaves_nothing(api: Api) -> None:
    await _volume(api, quota_bytes=4 * MiB)
    full = await _put(api, "data", "big", b"x" * (8 * MiB))
    assert full.status_code == 507 and full.json()["error"]["code"] == "volume_full"
    missing = await api.client.get("/v1/volumes/data/stat", params={"path": "big"},
                                   headers=api.acme)  # fmt: skip
    assert missing.status_code == 404
    assert (await _put(api, "data", "small", b"y" * MiB)).status_code == 200


async def test_a_volume_keeps_files_across_sandboxes_and_two_share_writes(api: Api) -> None:
    await _volume(api, quota_bytes=32 * MiB)
    mount = [{"name": "data", "path": "/mnt/data"}]
    first = await _sandbox(api, volumes=mount)
    code, out = await _sh(api, first, "echo one > /mnt/data/f && stat -c '%u %U' /mnt/data/f")
    assert (code, out.strip()) == (0, "1000 user")
    second = await _sandbox(api, volumes=[{"name": "data", "path": "/home/user/shared"}])
    code, out = await _sh(api, second, "cat /home/user/shared/f; echo two >> /home/user/shared/f")
    assert (code, out.strip()) == (0, "one")
    code, out = await _sh(api, first, "cat /mnt/data/f")
    assert out.split() == ["one", "two"]
    busy = await api.client.delete("/v1/volumes/data", headers=api.acme)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "volume_in_use"
    for sandbox_id in (first, second):
        killed = await api.client.delete(f"/v1/sandboxes/{sandbox_id}", headers=api.acme)
        assert killed.status_code in (200, 204), killed.text
    read = await api.client.get("/v1/volumes/data/files", params={"path": "f"}, headers=api.acme)
    assert read.content.split() == [b"one", b"two"]
    third = await _sandbox(api, volumes=mount)
    code, out = await _sh(api, third, "cat /mnt/data/f")
    assert out.split() == ["one", "two"]


async def test_a_read_only_mount_is_read_only_even_for_root(api: Api) -> None:
    await _volume(api, quota_bytes=16 * MiB)
    assert (await _put(api, "data", "kept", b"kept")).status_code == 200
    sandbox_id = await _sandbox(
        api, volumes=[{"name": "data", "path": "/mnt/ro", "read_only": True}]
    )
    code, out = await _sh(api, sandbox_id, "cat /mnt/ro/kept && touch /mnt/ro/new")
    assert code != 0 and out.startswith("kept") and "Read-only file system" in out
    code, out = await _sh(
        api, sandbox_id, "mount -o remount,rw /mnt/ro; touch /mnt/ro/new", user="root"
    )
    assert code != 0 and "Read-only file system" in out, out


async def test_a_full_volume_is_enospc_inside_the_sandbox(api: Api) -> None:
    await _volume(api, quota_bytes=8 * MiB)
    sandbox_id = await _sandbox(api, volumes=[{"name": "data", "path": "/mnt/data"}])
    code, out = await _sh(api, sandbox_id, "dd if=/dev/zero of=/mnt/data/fill bs=1M count=32")
    assert code != 0 and "No space left on device" in out
    info = await api.client.get("/v1/volumes/data", headers=api.acme)
    assert info.json()["used_bytes"] <= 8 * MiB


async def test_another_tenant_cannot_see_mount_read_write_or_delete_a_volume(api: Api) -> None:
    made = await _volume(api)
    assert (await _put(api, "data", "secret", b"s3cret")).status_code == 200
    for ref in ("data", made["id"]):
        for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/files?path=secret"),
                             ("GET", "/dir?path=/"), ("DELETE", "/files?path=secret")):  # fmt: skip
            answer = await api.client.request(
                method, f"/v1/volumes/{ref}{path}", headers=api.globex
            )
            assert answer.status_code == 404, (method, path, answer.text)
            assert answer.json()["error"]["code"] == "volume_not_found"
        put = await api.client.put(f"/v1/volumes/{ref}/files", params={"path": "x"},
                                   headers={**api.globex, **OCTETS}, content=b"x")  # fmt: skip
        assert put.status_code == 404
    assert (await api.client.get("/v1/volumes", headers=api.globex)).json() == []
    theft = {"volumes": [{"name": "data", "path": "/mnt/x"}]}
    mounted = await api.client.post("/v1/sandboxes", headers=api.globex, json=theft)
    assert mounted.status_code == 400 and "data" in mounted.json()["error"]["message"]
    # Its own volume of the same name is its own.
    theirs = await api.client.post("/v1/volumes", headers=api.globex, json={"name": "data"})
    assert theirs.status_code == 201 and theirs.json()["id"] != made["id"]
    read = await api.client.get("/v1/volumes/data/files", params={"path": "secret"},
                                headers=api.globex)  # fmt: skip
    assert read.status_code == 404 and read.json()["error"]["code"] == "not_found"


async def test_a_directory_downloads_as_a_tar_stream_with_links_kept_as_links(api: Api) -> None:
    await _volume(api, quota_bytes=64 * MiB)
    big = bytes(range(256)) * (12 * 1024)  # 3 MiB: several chunks
    for path, data in (("out/a.txt", b"a"), ("out/deep/b.bin", big), ("elsewhere", b"no")):
        assert (await _put(api, "data", path, data)).status_code == 200
    sandbox_id = await _sandbox(api, volumes=[{"name": "data", "path": "/mnt/data"}])
    planted = "ln -s /etc/passwd /mnt/data/out/pw && mkfifo /mnt/data/out/fifo"
    assert (await _sh(api, sandbox_id, planted))[0] == 0
    got = await api.client.get("/v1/volumes/data/archive", params={"path": "out"},
                               headers=api.acme)  # fmt: skip
    assert got.status_code == 200 and got.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(got.content)) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert sorted(members) == ["a.txt", "deep", "deep/b.bin", "pw"], sorted(members)
        assert members["pw"].issym() and members["pw"].linkname == "/etc/passwd"
        assert members["deep/b.bin"].uid == 1000 and members["deep"].isdir()
        extracted = archive.extractfile("deep/b.bin")
        assert extracted is not None and extracted.read() == big
    for bad in ("out/a.txt", "nothing", "out/pw", "../x"):
        refused = await api.client.get("/v1/volumes/data/archive", params={"path": bad},
                                       headers=api.acme)  # fmt: skip
        assert refused.status_code in (400, 404), (bad, refused.text)
    other = await api.client.get("/v1/volumes/data/archive", headers=api.globex)
    assert other.status_code == 404


async def test_a_rollback_restores_the_sandbox_and_leaves_its_volume_alone(api: Api) -> None:
    await _volume(api, quota_bytes=16 * MiB)
    sandbox_id = await _sandbox(api, volumes=[{"name": "data", "path": "/home/user/vol"}])
    assert (await _sh(api, sandbox_id, "echo before > /home/user/own"))[0] == 0
    made = await api.client.post(f"/v1/sandboxes/{sandbox_id}/checkpoints", headers=api.acme)
    assert made.status_code == 201, made.text
    later = "echo after > /home/user/own; echo kept > /home/user/vol/shared"
    assert (await _sh(api, sandbox_id, later))[0] == 0
    back = {"checkpoint": made.json()["id"]}
    rolled = await api.client.post(
        f"/v1/sandboxes/{sandbox_id}/rollback", headers=api.acme, json=back
    )
    assert rolled.status_code == 204, rolled.text
    code, out = await _sh(api, sandbox_id, "cat /home/user/own /home/user/vol/shared")
    assert (code, out.split()) == (0, ["before", "kept"]), out


async def test_a_sandbox_paused_to_disk_has_its_volume_again_when_resumed(api: Api) -> None:
    await _volume(api, quota_bytes=16 * MiB)
    sandbox_id = await _sandbox(api, volumes=[{"name": "data", "path": "/mnt/data"}])
    assert (await _sh(api, sandbox_id, "echo one > /mnt/data/f"))[0] == 0
    paused = await api.client.post(f"/v1/sandboxes/{sandbox_id}/pause", headers=api.acme,
                                   json={"memory": False}, timeout=60)  # fmt: skip
    assert paused.status_code == 200, paused.text
    busy = await api.client.delete("/v1/volumes/data", headers=api.acme)
    assert busy.status_code == 409 and sandbox_id in busy.json()["error"]["message"]
    assert (await _put(api, "data", "g", b"two")).status_code == 200  # while it is paused
    resumed = await api.client.post(f"/v1/sandboxes/{sandbox_id}/resume", headers=api.acme,
                                    timeout=60)  # fmt: skip
    assert resumed.status_code == 200, resumed.text
    code, out = await _sh(api, sandbox_id, "cat /mnt/data/f /mnt/data/g")
    assert (code, out.split()) == (0, ["one", "two"]), out
