"""Attacks on volumes, each the attack first: a sandbox plants symlinks (and ``..``) for the
server's file calls to follow out of the volume; setuid binaries and device nodes in a
volume; a volume filled to its quota (the host's disk); a read-only mount; and volumes kept
across a server's stop and a server's crash."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server._envd import run
from tests.server.conftest import Api
from tests.server.test_serve_process import Server

pytestmark = pytest.mark.integration
OCTETS = {"content-type": "application/octet-stream"}
MiB = 1 << 20


async def _volume(api: Api, name: str = "data", quota: int = 16 * MiB) -> dict[str, Any]:
    created = await api.client.post(
        "/v1/volumes", headers=api.acme, json={"name": name, "quota_bytes": quota}
    )
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    return body


async def _mounted(api: Api, **mount: object) -> str:
    spec = {"volumes": [{"name": "data", "path": "/mnt/data", **mount}]}
    created = await api.client.post("/v1/sandboxes", headers=api.acme, json=spec, timeout=60)
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


async def _sh(api: Api, sandbox_id: str, script: str, user: str | None = None) -> tuple[int, str]:
    ran = await run(
        api.client, api.acme, sandbox_id, ["sh", "-c", f"exec 2>&1; {script}"], user=user
    )
    assert ran.error is None, ran
    return int(ran.end.get("exitCode", 0)), ran.stdout


def _host_mount(api: Api, volume_id: str) -> Path:
    """Where the server mounts the volume (the test is the host's root)."""
    return api.services.config.data_dir / "volumes" / "mnt" / volume_id


async def test_planted_symlinks_and_dotdot_never_lead_the_api_out_of_the_volume(
    api: Api, tmp_path: Path
) -> None:
    await _volume(api)
    sandbox_id = await _mounted(api)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    planted = (
        f"ln -s / /mnt/data/root; ln -s {outside}/secret /mnt/data/pw; "
        f"ln -s {outside} /mnt/data/out; mkdir -p /mnt/data/d && ln -s ../.. /mnt/data/d/up"
    )
    assert (await _sh(api, sandbox_id, planted))[0] == 0
    files = "/v1/volumes/data/files"
    for path in ("root/etc/passwd", "pw", "out/secret", "d/up/etc/passwd", "/root/etc/shadow"):
        got = await api.client.get(files, params={"path": path}, headers=api.acme)
        assert got.status_code == 400, (path, got.status_code, got.text[:200])
        assert b"host secret" not in got.content and b"root:" not in got.content
    for path in ("../../etc/passwd", "/a/../../etc/passwd", "d/../../x"):
        got = await api.client.get(files, params={"path": path}, headers=api.acme)
        assert got.status_code == 400 and got.json()["error"]["code"] == "invalid_request"
    for path in ("out/new", "root/tmp/planted", "pw", "d/up/planted"):
        put = await api.client.put(files, params={"path": path}, content=b"x",
                                   headers={**api.acme, **OCTETS})  # fmt: skip
        assert put.status_code == 400, (path, put.text)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_text() == "host secret"
    assert not Path("/tmp/planted").exists()
    listed = await api.client.get("/v1/volumes/data/dir", params={"path": "out"},
                                  headers=api.acme)  # fmt: skip
    assert listed.status_code == 400
    removed = await api.client.delete(files, params={"path": "out/secret"}, headers=api.acme)
    assert removed.status_code == 400 and (outside / "secret").exists()
    removed = await api.client.delete(files, params={"path": "out"}, headers=api.acme)
    assert removed.status_code == 204 and (outside / "secret").exists(), "the link, not its target"
    entry = await api.client.get("/v1/volumes/data/stat", params={"path": "pw"}, headers=api.acme)
    assert entry.json()["type"] == "symlink" and entry.json()["target"] == f"{outside}/secret"


async def test_setuid_binaries_and_device_nodes_in_a_volume_are_inert(api: Api) -> None:
    made = await _volume(api)
    sandbox_id = await _mounted(api)
    # Root inside plants a setuid-root shell; the user runs it: still the user.
    planted = "cp /bin/sh /mnt/data/sush && chmod 4755 /mnt/data/sush && stat -c %a /mnt/data/sush"
    code, out = await _sh(api, sandbox_id, planted, user="root")
    assert (code, out.strip()) == (0, "4755")
    code, out = await _sh(api, sandbox_id, "/mnt/data/sush -c 'id -u; id -ru'")
    assert out.split() == ["1000", "1000"], out
    code, out = await _sh(api, sandbox_id, "mknod /mnt/data/mem c 1 1", user="root")
    assert code != 0, out
    # A device node put there from outside (a crafted image): nodev keeps it closed.
    host = _host_mount(api, made["id"])
    os.mknod(host / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    code, out = await _sh(api, sandbox_id, "head -c 4 /mnt/data/zero", user="root")
    assert code != 0 and "Permission denied" in out, out
    got = await api.client.get("/v1/volumes/data/files", params={"path": "zero"},
                               headers=api.acme)  # fmt: skip
    assert got.status_code == 400, got.text
    code, out = await _sh(api, sandbox_id, "grep ' /mnt/data ' /proc/self/mountinfo")
    assert "nosuid" in out and "nodev" in out, out
    # Through the API, a mode never keeps setuid or setgid.
    written = await api.client.put(
        "/v1/volumes/data/files", params={"path": "s", "mode": 0o6755},
        headers={**api.acme, **OCTETS}, content=b"#!/bin/sh\n",
    )  # fmt: skip
    assert written.status_code == 200 and written.json()["mode"] == 0o755, written.text


async def test_a_full_volume_costs_the_host_its_quota_at_most(api: Api) -> None:
    made = await _volume(api, quota=8 * MiB)
    sandbox_id = await _mounted(api)
    fill = (
        "dd if=/dev/urandom of=/mnt/data/fill bs=1M count=64; i=0; "
        "while [ $i -lt 3000 ]; do : > /mnt/data/f$i || break; i=$((i+1)); done; echo made $i"
    )  # bytes, then inodes
    _, out = await _sh(api, sandbox_id, fill)
    assert "No space left on device" in out, out
    image = api.services.config.data_dir / "volumes" / "images" / f"{made['id']}.img"
    assert image.stat().st_size == 8 * MiB
    assert image.stat().st_blocks * 512 <= 8 * MiB, "the image holds no more than its quota"
    info = await api.client.get("/v1/volumes/data", headers=api.acme)
    assert 0 < info.json()["used_bytes"] <= 8 * MiB
    # The sandbox itself is fine, and so is the volume once something is removed.
    assert (await _sh(api, sandbox_id, "rm /mnt/data/fill && echo ok > /mnt/data/after"))[0] == 0


async def test_a_read_only_mount_cannot_be_changed_by_any_means_inside(api: Api) -> None:
    await _volume(api)
    put = await api.client.put("/v1/volumes/data/files", params={"path": "kept"},
                               headers={**api.acme, **OCTETS}, content=b"kept")  # fmt: skip
    assert put.status_code == 200
    sandbox_id = await _mounted(api, read_only=True)
    attempts = [
        "echo x > /mnt/data/kept", "rm /mnt/data/kept", "touch /mnt/data/new",
        "chmod 777 /mnt/data/kept", "mv /mnt/data/kept /mnt/data/moved",
        "mount -o remount,rw /mnt/data", "mount -o remount,rw,bind /mnt/data",
        "umount /mnt/data",
    ]  # fmt: skip
    for attempt in attempts:
        code, out = await _sh(api, sandbox_id, attempt, user="root")
        assert code != 0, (attempt, out)
    code, out = await _sh(
        api, sandbox_id, "cat /mnt/data/kept; grep ' /mnt/data ' /proc/self/mountinfo"
    )
    assert out.startswith("kept") and " ro," in out, out
    got = await api.client.get("/v1/volumes/data/files", params={"path": "kept"}, headers=api.acme)
    assert got.content == b"kept"
    listed = await api.client.get("/v1/volumes/data/dir", params={"path": "/"}, headers=api.acme)
    assert sorted(e["name"] for e in listed.json()) == ["kept", "lost+found"]


def _start(server: Server) -> dict[str, str]:
    server.start()
    key = (server.data_dir / "admin-key").read_text().strip()
    return {"Authorization": f"Bearer {key}"}


def test_volumes_survive_a_server_stop_and_a_crash(local_host: object, tmp_path: Path) -> None:
    server = Server(tmp_path / "data", None)
    headers = _start(server)
    try:
        made = httpx.post(f"{server.url}/v1/volumes", headers=headers, json={"name": "kept"})
        assert made.status_code == 201, made.text
        spec = {"volumes": [{"name": "kept", "path": "/mnt/kept"}]}
        created = httpx.post(f"{server.url}/v1/sandboxes", headers=headers, json=spec, timeout=60)
        assert created.status_code == 201, created.text
        put = httpx.put(f"{server.url}/v1/sandboxes/{created.json()['id']}/files",
                        params={"path": "/mnt/kept/one"}, content=b"one",
                        headers={**headers, **OCTETS}, timeout=60)  # fmt: skip
        assert put.status_code == 200, put.text
    finally:
        server.stop()
    files = f"{server.url}/v1/volumes/kept/files"
    headers = _start(server)
    try:
        assert httpx.get(files, params={"path": "one"}, headers=headers).content == b"one"
        created = httpx.post(f"{server.url}/v1/sandboxes", headers=headers, json=spec, timeout=60)
        assert created.status_code == 201, created.text
        put = httpx.put(files, params={"path": "two"}, content=b"two",
                        headers={**headers, **OCTETS})  # fmt: skip
        assert put.status_code == 200
    finally:
        server.kill()  # a crash: its sandbox dies with it, its mounts stay behind
    headers = _start(server)
    try:
        deadline = time.monotonic() + 10  # the dead sandbox's last hold on the disk goes
        while True:
            got = httpx.get(files, params={"path": "two"}, headers=headers)
            if got.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert got.content == b"two", got.text
        assert httpx.get(files, params={"path": "one"}, headers=headers).content == b"one"
    finally:
        server.stop()


async def test_a_symlink_planted_at_a_volumes_target_in_a_snapshot_is_refused(api: Api) -> None:
    """Review 2b, M2: a sandbox plants ``/home/user/data -> /tmp/elsewhere`` (or a link to
    a parent of it), is snapshotted, and a sandbox made from the snapshot mounts a volume
    at ``/home/user/data``: bwrap followed the link and mounted the volume elsewhere."""
    await _volume(api)
    parent = await api.client.post("/v1/sandboxes", headers=api.acme, json={}, timeout=60)
    assert parent.status_code == 201, parent.text
    parent_id = parent.json()["id"]
    code, out = await _sh(
        api, parent_id, "mkdir -p /tmp/elsewhere /home/user/deep && "
        "ln -s /tmp/elsewhere /home/user/data && ln -s /tmp /home/user/deep/via",
    )  # fmt: skip
    assert code == 0, out
    made = await api.client.post(f"/v1/sandboxes/{parent_id}/snapshot", headers=api.acme)
    assert made.status_code == 201, made.text
    for target, link in (
        ("/home/user/data", "/home/user/data"),
        ("/home/user/deep/via/x", "/home/user/deep/via"),
    ):
        spec = {"snapshot": made.json()["id"], "volumes": [{"name": "data", "path": target}]}
        refused = await api.client.post("/v1/sandboxes", headers=api.acme, json=spec, timeout=60)
        # Refused before bwrap runs (the launch's failure: sandbox_error, saying why).
        assert refused.status_code == 500, refused.text
        assert f"{link} is a symlink" in refused.json()["error"]["message"]
    spec = {"snapshot": made.json()["id"], "volumes": [{"name": "data", "path": "/home/user/ok"}]}
    fine = await api.client.post("/v1/sandboxes", headers=api.acme, json=spec, timeout=60)
    assert fine.status_code == 201, fine.text  # a target without a link is mounted as ever
