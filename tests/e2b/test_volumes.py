"""E2B's ``Volume`` and ``volume_mounts=`` through the unmodified SDK: create, connect, list,
get_info, destroy, the content calls with the volume's own token, a volume mounted in two
sandboxes (each seeing the other's writes, kept after both end), and another tenant's
reach (none)."""

from __future__ import annotations

import uuid

import pytest
from e2b.exceptions import AuthenticationException, NotFoundException

from e2b import Sandbox, Volume, VolumeException, VolumeFileType
from tests.e2b.conftest import E2bServer


def _name() -> str:
    return f"vol-{uuid.uuid4().hex[:8]}"


def test_a_volume_is_created_connected_listed_and_destroyed(e2b_server: E2bServer) -> None:
    vol = Volume.create(_name())
    assert vol.volume_id.startswith("vo") and vol.token
    assert vol.volume_id in [v.volume_id for v in Volume.list()]
    info = Volume.get_info(vol.volume_id)
    assert (info.name, info.volume_id) == (vol.name, vol.volume_id)
    again = Volume.connect(vol.volume_id)
    assert again.name == vol.name and again.token
    with pytest.raises(VolumeException):
        Volume.create(vol.name)  # names are unique per tenant
    assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    with pytest.raises(NotFoundException):
        Volume.get_info(vol.volume_id)


def test_files_move_through_the_volume_content_api(e2b_server: E2bServer) -> None:
    vol = Volume.create(_name())
    try:
        written = vol.write_file("/notes/a.txt", "hello")
        assert (written.name, written.path, written.size) == ("a.txt", "/notes/a.txt", 5)
        assert written.type == VolumeFileType.FILE and written.uid == 1000
        assert vol.read_file("/notes/a.txt") == "hello"
        assert vol.read_file("/notes/a.txt", format="bytes") == b"hello"
        assert b"".join(vol.read_file("/notes/a.txt", format="stream")) == b"hello"
        made = vol.make_dir("/deep/er", force=True)
        assert made.type == VolumeFileType.DIRECTORY
        listed = {entry.path for entry in vol.list("/", depth=2)}
        assert {"/notes", "/notes/a.txt", "/deep", "/deep/er"} <= listed
        changed = vol.update_metadata("/notes/a.txt", mode=0o4600)
        assert changed.mode == 0o600, "setuid is never set"
        assert vol.exists("/notes/a.txt") and not vol.exists("/nothing")
        vol.remove("/notes")
        assert not vol.exists("/notes/a.txt")
        with pytest.raises(NotFoundException):
            vol.read_file("/notes/a.txt")
        with pytest.raises(VolumeException):
            vol.read_file("../../etc/passwd")
    finally:
        Volume.destroy(vol.volume_id)


def test_a_volume_is_shared_by_two_sandboxes_and_outlives_them(e2b_server: E2bServer) -> None:
    vol = Volume.create(_name())
    try:
        with Sandbox.create(volume_mounts={"/mnt/data": vol}) as first:
            first.commands.run("echo from-first > /mnt/data/shared.txt")
            with Sandbox.create(volume_mounts={"/home/user/vol": vol.name}) as second:
                assert second.files.read("/home/user/vol/shared.txt") == "from-first\n"
                second.commands.run("echo from-second >> /home/user/vol/shared.txt")
                assert first.files.read("/mnt/data/shared.txt") == "from-first\nfrom-second\n"
                with pytest.raises(VolumeException):
                    Volume.destroy(vol.volume_id)  # mounted: 409 volume_in_use
        assert vol.read_file("/shared.txt") == "from-first\nfrom-second\n"
    finally:
        Volume.destroy(vol.volume_id)


def test_another_tenant_cannot_reach_a_volume(e2b_server: E2bServer) -> None:
    vol = Volume.create(_name())
    try:
        vol.write_file("secret.txt", "s3cret")
        other = {"api_key": e2b_server.other_key}
        assert vol.volume_id not in [v.volume_id for v in Volume.list(**other)]
        with pytest.raises(NotFoundException):
            Volume.get_info(vol.volume_id, **other)
        assert Volume.destroy(vol.volume_id, **other) is False
        with pytest.raises(Exception, match="no volume"):
            Sandbox.create(volume_mounts={"/mnt/x": vol.name}, **other)
        # A token is for its volume only: another volume's id with it is refused.
        theirs = Volume.create(_name(), **other)
        try:
            stolen = Volume(theirs.volume_id, theirs.name, token=vol.token)
            with pytest.raises(AuthenticationException):
                stolen.read_file("anything")
            forged = Volume(vol.volume_id, vol.name, token=theirs.token)
            with pytest.raises(AuthenticationException):
                forged.read_file("secret.txt")
        finally:
            Volume.destroy(theirs.volume_id, **other)
    finally:
        Volume.destroy(vol.volume_id)
