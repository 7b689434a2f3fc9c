"""Importing image archives: layers in order, whiteouts, and every hostile entry refused."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest

from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.templates import Registry, import_template, resolve
from tests.templates._images import Entry, busybox_layers, docker_archive, layer, oci_archive


@pytest.fixture
def config(open_tmp: Path) -> Config:
    return Config(data_dir=open_tmp / "data")


@pytest.mark.parametrize("layout", ["docker", "docker-dot", "oci", "oci-flat"])
def test_layers_apply_in_order_with_whiteouts(config: Config, open_tmp: Path, layout: str) -> None:
    archive = open_tmp / "image.tar"
    if layout.startswith("docker"):
        docker_archive(archive, busybox_layers(), prefix="./" if layout == "docker-dot" else "")
    else:
        oci_archive(archive, busybox_layers(), nested=layout == "oci")
    template = import_template(config, "bb", archive)
    root = template.rootfs
    assert (root / "etc" / "kept.txt").read_text() == "second\n"
    assert not (root / "etc" / "gone.txt").exists()
    assert sorted(os.listdir(root / "opaque")) == ["new.txt"]
    assert not list(root.rglob(".wh.*"))
    assert template.metadata["layout"] == layout.split("-")[0]
    assert resolve("bb", config) == str(root)


def test_nothing_is_kept_that_could_gain_or_hide_privileges(config: Config, open_tmp: Path) -> None:
    template = import_template(config, "bb", docker_archive(open_tmp / "i.tar", busybox_layers()))
    root = template.rootfs
    busybox = (root / "bin" / "busybox").stat()
    assert stat.S_IMODE(busybox.st_mode) == 0o755, "setuid dropped"
    assert (busybox.st_uid, busybox.st_gid) == (os.geteuid(), os.getegid()), "owner not kept"
    assert (root / "bin" / "test").stat().st_ino == busybox.st_ino, "hard link kept"
    assert not (root / "dev" / "null").exists(), "device nodes skipped"
    assert stat.S_IMODE((root / "private").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "private" / "secret").stat().st_mode) == 0o644
    metadata = template.metadata
    assert (metadata["skipped_devices"], metadata["stripped_setuid"]) == (1, 1)
    for path in [root, *root.rglob("*")]:
        assert not path.lstat().st_mode & 0o022 or path.is_symlink(), path


@pytest.mark.parametrize(
    "name", ["../escape.txt", "bin/../../escape.txt", "/etc/ringfence-escape", "etc/.wh..."]
)
def test_a_path_out_of_the_root_refuses_the_whole_import(
    config: Config, open_tmp: Path, name: str
) -> None:
    hostile = layer([Entry("bin", "dir"), Entry(name, data=b"pwned\n")])
    archive = docker_archive(open_tmp / "i.tar", [*busybox_layers(), hostile])
    with pytest.raises(InvalidRequest) as raised:
        import_template(config, "evil", archive)
    assert raised.value.code == "invalid_request"
    assert not (open_tmp / "escape.txt").exists() and not Path("/etc/ringfence-escape").exists()
    assert Registry.for_config(config).list() == []
    assert os.listdir(open_tmp / "ringfence-templates") == [], "the staging copy is gone"


def test_a_hard_link_out_of_the_root_is_refused(config: Config, open_tmp: Path) -> None:
    hostile = layer([Entry("bin", "dir"), Entry("bin/shadow", "hardlink", target="../etc/shadow")])
    with pytest.raises(InvalidRequest):
        import_template(config, "evil", docker_archive(open_tmp / "i.tar", [hostile]))


def test_entries_through_symlinks_stay_in_the_root(config: Config, open_tmp: Path) -> None:
    outside = Path("/tmp", f"ringfence-escape-{uuid.uuid4().hex}")
    first = layer(
        [
            Entry("bin", "dir"),
            Entry("climb", "symlink", target="../../../../../.." + str(outside)),
            Entry("absolute", "symlink", target=str(outside)),
            Entry("etc-link", "symlink", target="/etc"),
        ]
    )
    second = layer(
        [
            Entry("climb/one", data=b"x\n"),
            Entry("absolute/two", data=b"x\n"),
            Entry("etc-link/ringfence-escape", data=b"x\n"),
            Entry("etc-link/.wh.hostname"),  # must never delete the host's /etc/hostname
        ]
    )
    archive = oci_archive(open_tmp / "i.tar", [first, second])
    root = import_template(config, "links", archive).rootfs
    assert not outside.exists() and not Path("/etc/ringfence-escape").exists()
    assert Path("/etc/hostname").exists()
    inside = root / outside.relative_to("/")
    assert sorted(os.listdir(inside)) == ["one", "two"]
    assert (root / "etc" / "ringfence-escape").read_text() == "x\n"
    assert os.readlink(root / "absolute") == str(outside), "links are kept as they are"


def test_not_an_archive_is_a_clear_error(config: Config, open_tmp: Path) -> None:
    junk = open_tmp / "junk.tar"
    junk.write_bytes(b"this is not a tar file\n" * 100)
    for path in (junk, open_tmp / "missing.tar", open_tmp):
        with pytest.raises(InvalidRequest) as raised:
            import_template(config, "x", path)
        assert str(path) in raised.value.message


def test_an_archive_without_a_manifest_is_refused(config: Config, open_tmp: Path) -> None:
    archive = open_tmp / "bare.tar"
    import tarfile

    with tarfile.open(archive, "w") as tar:
        tar.add("/etc/hostname", "hostname")
    with pytest.raises(InvalidRequest) as raised:
        import_template(config, "x", archive)
    assert "manifest.json" in raised.value.message


def test_a_corrupt_oci_layer_is_refused(config: Config, open_tmp: Path) -> None:
    archive = oci_archive(open_tmp / "i.tar", busybox_layers())
    data = bytearray(archive.read_bytes())
    marker = data.find(b"deleted by the second layer")
    data[marker] ^= 0x20
    archive.write_bytes(bytes(data))
    with pytest.raises(InvalidRequest) as raised:
        import_template(config, "x", archive)
    assert "digest" in raised.value.message


def test_a_name_must_be_a_dns_label_and_free(config: Config, open_tmp: Path) -> None:
    archive = docker_archive(open_tmp / "i.tar", busybox_layers())
    for bad in ("Upper", "-dash", "a/b", "..", "x" * 64, ""):
        with pytest.raises(InvalidRequest):
            import_template(config, bad, archive)
    import_template(config, "once", archive)
    with pytest.raises(InvalidRequest):
        import_template(config, "once", archive)
    replaced = import_template(config, "once", archive, replace=True)
    assert replaced.rootfs.is_dir()
