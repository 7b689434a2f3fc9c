import os
from pathlib import Path

import pytest

from ringfence.backends.local.rootfs import (
    GENERATED_ETC,
    Entry,
    Kind,
    RuntimeFiles,
    layout_for,
    overlaid,
    prepare_runtime_files,
)
from ringfence.errors import InvalidRequest


@pytest.fixture
def files(tmp_path: Path) -> RuntimeFiles:
    host_etc = tmp_path / "host-etc"
    (host_etc / "ssl").mkdir(parents=True)
    (host_etc / "ssl" / "cert.pem").write_text("CERT")
    (host_etc / "nsswitch.conf").write_text("hosts: files\n")
    (host_etc / "shadow").write_text("root:secret")
    private = host_etc / "ssl" / "private"
    private.mkdir()
    (private / "key.pem").write_text("KEY")
    private.chmod(0o710)
    (host_etc / "ssl" / "secret.key").write_text("KEY")
    (host_etc / "ssl" / "secret.key").chmod(0o600)
    (host_etc / "python3").mkdir(mode=0o700)
    os.symlink("/usr/share/zoneinfo/UTC", host_etc / "localtime")
    return prepare_runtime_files(tmp_path / "runtime", host_etc)


def test_the_etc_copy_holds_only_the_allowlist_and_generated_files(files: RuntimeFiles) -> None:
    names = set(os.listdir(files.host_etc))
    assert names == {"ssl", "nsswitch.conf", "localtime", *GENERATED_ETC}
    assert "shadow" not in names, "not on the allowlist"
    assert "python3" not in names, "on the allowlist but private"
    assert set(os.listdir(files.host_etc / "ssl")) == {"cert.pem"}, "private entries stay home"
    assert os.readlink(files.host_etc / "localtime") == "/usr/share/zoneinfo/UTC"
    assert (files.host_etc / "passwd").read_text() == GENERATED_ETC["passwd"]
    for path in [files.host_etc, *files.host_etc.rglob("*")]:
        if not path.is_symlink():
            want = 0o005 if path.is_dir() else 0o004  # others may read (and enter)
            assert path.stat().st_mode & want == want, path


def test_the_copy_is_reused_until_a_source_changes(tmp_path: Path, files: RuntimeFiles) -> None:
    host_etc = tmp_path / "host-etc"
    again = prepare_runtime_files(tmp_path / "runtime", host_etc)
    assert again == files
    (host_etc / "nsswitch.conf").write_text("hosts: files dns\n")
    changed = prepare_runtime_files(tmp_path / "runtime", host_etc)
    assert changed.host_etc != files.host_etc
    assert (files.host_etc / "nsswitch.conf").read_text() == "hosts: files\n", "old copy intact"


def test_the_host_layout_binds_system_directories_and_the_etc_copy(files: RuntimeFiles) -> None:
    layout = layout_for("host", files)
    targets = {entry.target: entry for entry in layout}
    assert targets["/etc"] == Entry(Kind.RO_BIND, str(files.host_etc), "/etc")
    assert "/usr" in targets
    for private in ("/home", "/root", "/run", "/tmp", "/var/lib", "/proc"):
        assert private not in targets


def test_a_directory_rootfs_shows_its_own_tree_with_generated_identity(
    tmp_path: Path, files: RuntimeFiles
) -> None:
    root = tmp_path / "rootfs"
    for name in ("bin", "usr", "etc", "proc", "tmp", "home"):
        (root / name).mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.symlink("usr/lib", root / "lib")
    layout = layout_for(str(root), files)
    targets = {entry.target: entry for entry in layout}
    assert targets["/bin"] == Entry(Kind.RO_BIND, str(root / "bin"), "/bin")
    assert targets["/lib"] == Entry(Kind.SYMLINK, "usr/lib", "/lib")
    assert targets["/etc"] == Entry(Kind.RO_BIND, str(root / "etc"), "/etc")
    assert targets["/etc/passwd"].source == str(files.generated_etc / "passwd")
    assert "/etc/group" not in targets, "only files the image has can be bound over"
    for own in ("/proc", "/tmp", "/home"):
        assert own not in targets


def test_unknown_images_are_refused_clearly(tmp_path: Path, files: RuntimeFiles) -> None:
    with pytest.raises(InvalidRequest) as exc:
        layout_for("ubuntu:22.04", files)
    assert exc.value.code == "invalid_request"
    with pytest.raises(InvalidRequest):
        layout_for(str(tmp_path / "nothing"), files)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidRequest):
        layout_for(str(tmp_path / "empty"), files)


def test_a_runtime_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    """Whatever is in it is trusted (the daemon's code, the sockets): fail closed."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by other users"):
        prepare_runtime_files(shared, tmp_path)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(PermissionError, match="not a directory"):
        prepare_runtime_files(link, tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        prepare_runtime_files(theirs, tmp_path)


def test_a_sandbox_with_a_volume_overlays_each_bound_directory_only(
    tmp_path: Path, files: RuntimeFiles
) -> None:
    root = tmp_path / "rootfs"
    for name in ("usr", "var", "etc"):
        (root / name).mkdir(parents=True)
    (root / "etc" / "passwd").write_text("x")
    os.symlink("usr/bin", root / "bin")
    layout = layout_for(str(root), files)
    targets = [target for _, target in overlaid(layout)]
    assert sorted(targets) == ["/etc", "/usr", "/var"], "no file binds, no symlinks"
    assert (str(root / "usr"), "/usr") in overlaid(layout)
    host = [target for _, target in overlaid(layout_for("host", files))]
    assert "/usr" in host and "/etc" in host and "/var" not in host
