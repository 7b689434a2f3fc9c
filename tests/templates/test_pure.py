"""Pure helpers of template builds: the progress condenser and the host's mirror."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ringfence.errors import InvalidRequest
from ringfence.templates.build import Progress, host_mirror, private_files
from ringfence.templates.layers import entry_parts


def test_progress_shows_each_stage_once_and_keeps_the_tail() -> None:
    shown: list[str] = []
    progress = Progress(shown.append, "debootstrap")
    lines = [
        "I: Retrieving InRelease ",
        "I: Retrieving adduser 3.134",
        "I: Validating adduser 3.134",
        "I: Retrieving apt 2.6.1",
        "I: Validating apt 2.6.1",
        "I: Extracting zlib1g...",
        "W: Failure trying to run: chroot",
        "Get:1 http://deb.debian.org/debian bookworm/main amd64 python3 amd64 3.11.2 [26 kB]",
        "Setting up python3 (3.11.2-1+b1) ...",
        "noise",
    ]
    for line in lines:
        progress.feed(line + "\n")
    assert shown == [
        "debootstrap: Retrieving InRelease",
        "debootstrap: retrieving packages",
        "debootstrap: validating packages",
        "debootstrap: extracting packages",
        "debootstrap: W: Failure trying to run: chroot",
        "debootstrap: downloading packages",
        "debootstrap: configuring packages",
    ]
    assert list(progress.tail)[-1] == "noise"


def test_the_mirror_comes_from_this_hosts_apt_sources(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm\n"
    )
    legacy = tmp_path / "sources.list"
    legacy.write_text("# deb http://commented.example/debian bookworm main\n"
                      "deb [arch=amd64] https://other.example/debian bookworm main\n")  # fmt: skip
    assert host_mirror([tmp_path / "missing", deb822]) == "http://mirror.example/debian"
    assert host_mirror([legacy]) == "https://other.example/debian"
    assert host_mirror([tmp_path / "missing"]) is None


@pytest.mark.parametrize(
    ("name", "parts"),
    [("./a/b", ["a", "b"]), ("a//b/", ["a", "b"]), ("./", []), ("a/./b", ["a", "b"])],
)
def test_entry_names_are_normalised(name: str, parts: list[str]) -> None:
    assert entry_parts(name) == parts


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "a/.."])
def test_entry_names_that_leave_the_root_are_refused(name: str) -> None:
    with pytest.raises(InvalidRequest):
        entry_parts(name)


def test_a_build_names_the_files_others_may_not_read(tmp_path: Path) -> None:
    """The sandbox's root owns a template's files (idmapped lower layers): what is not
    world-readable (a secret baked in) is readable by every sandbox anyway."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "shadow").write_text("root:$6$...")
    (tmp_path / "etc" / "shadow").chmod(0o640)
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0")
    (tmp_path / "etc" / "passwd").chmod(0o644)
    (tmp_path / "root").mkdir(mode=0o700)
    (tmp_path / "root").chmod(0o700)
    (tmp_path / "root" / "key").write_text("secret")
    (tmp_path / "root" / "key").chmod(0o600)
    (tmp_path / "etc" / "link").symlink_to("shadow")  # a link's own mode means nothing
    assert private_files(tmp_path) == ["/etc/shadow", "/root", "/root/key"]


def test_pip_output_is_condensed_to_its_stages() -> None:
    lines: list[str] = []
    progress = Progress(lines.append, "pip")
    for line in (
        "Looking in links: /var/cache/ringfence-pip",
        "Collecting uv==0.13.8",
        "Processing /var/cache/ringfence-pip/uv-0.13.8-py3-none-manylinux_2_17_x86_64.whl",
        "Installing collected packages: uv",
        "Successfully installed uv-0.13.8",
    ):
        progress.feed(line)
    assert lines == [
        "pip: collecting packages",
        "pip: configuring packages",
        "pip: installing packages",
        "pip: Successfully installed uv-0.13.8",
    ]


@pytest.mark.parametrize(
    ("packages", "pypi"),
    [
        (["python3", "python3-pip"], ["uv"]),  # not pinned
        (["python3", "python3-pip"], ["uv>=0.1"]),
        (["python3", "python3-pip"], ["uv==0.13.8; rm -rf /"]),
        (["python3"], ["uv==0.13.8"]),  # no pip to install it with
    ],
)
def test_pypi_requirements_must_be_pinned_and_have_pip(
    tmp_path: Path, packages: list[str], pypi: list[str]
) -> None:
    from ringfence.templates import Registry
    from ringfence.templates.build import build_template

    with pytest.raises(InvalidRequest):
        build_template(Registry(tmp_path), "x", packages, pypi=pypi)
    assert list(tmp_path.iterdir()) == []


def test_debootstrap_checks_the_suites_signature_or_the_build_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build never installs packages nobody signed: debootstrap gets the keyring and
    --force-check-gpg (without it, debootstrap only warns when it cannot check), and a
    host without the keyring is refused before anything is fetched."""
    from ringfence.templates import Registry, build
    from ringfence.templates.build import BuildFailed, build_template

    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        pytest.fail("template builds need root and debootstrap (scripts/setup installs it)")
    ran: list[list[str]] = []

    def stop(argv: list[str], *_: object) -> None:
        ran.append(argv)
        raise BuildFailed("stopped by the test")

    monkeypatch.setattr(build, "_run", stop)
    with pytest.raises(BuildFailed, match="stopped by the test"):
        build_template(Registry(tmp_path / "t"), "x", [], cache_dir=tmp_path / "cache")
    assert "--force-check-gpg" in ran[0] and f"--keyring={build.KEYRING}" in ran[0], ran

    monkeypatch.setattr(build, "KEYRING", str(tmp_path / "no-such-keyring.gpg"))
    with pytest.raises(BuildFailed, match=r"no-such-keyring\.gpg is missing"):
        build_template(Registry(tmp_path / "u"), "x", [], cache_dir=tmp_path / "cache")
    assert len(ran) == 1, "nothing ran without a keyring"
