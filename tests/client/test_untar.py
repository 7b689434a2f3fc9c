"""The SDK's extraction of a sandbox's archive (``download_dir``, ``files archive -x``)
against archives a hostile sandbox can send: the PATH_MAX chain that beats CPython's
``data`` filter before 3.11.13 (CVE-2025-4517), links written through, a directory
replaced by a link, hard links, special files, repeated and climbing names, setuid modes,
and archives past the bounds. Each attack writes nothing outside the target."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from ringfence.client._untar import extract_archive
from ringfence.errors import SandboxError
from ringfence.sandboxd.archive import tar_stream


def _entry(
    name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644
) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type, entry.linkname, entry.mode = kind, linkname, mode
    entry.size = 4 if kind == tarfile.REGTYPE else 0
    return entry


def _crafted(path: Path, *entries: tarfile.TarInfo, content: bytes = b"evil") -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            if entry.type == tarfile.REGTYPE:
                entry.size = len(content)
                tar.addfile(entry, io.BytesIO(content))
            else:
                tar.addfile(entry)
    return path


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """An empty target, and beside it a victim directory holding ``victim.txt``."""
    target, victim = tmp_path / "out", tmp_path / "victim"
    target.mkdir()
    victim.mkdir()
    (victim / "victim.txt").write_text("original\n")
    return target, victim


def _untouched(victim: Path) -> None:
    assert sorted(p.name for p in victim.iterdir()) == ["victim.txt"]
    assert (victim / "victim.txt").read_text() == "original\n"
    assert (victim / "victim.txt").stat().st_nlink == 1


def _path_max_chain(escape_target_tail: str) -> list[tarfile.TarInfo]:
    """The review's PoC (/tmp/review2b/poc_tar.py): 16 levels of 247-character
    directories with one-letter links to them, a 254-character link climbing 16 levels,
    and ``escape`` through it to ``../victim`` (the filter's realpath gives up past
    PATH_MAX, so it approves a link the kernel resolves outside)."""
    comp, steps, path = "d" * 247, "abcdefghijklmnop", ""
    entries = []
    for step in steps:
        entries.append(_entry(os.path.join(path, comp), tarfile.DIRTYPE, mode=0o755))
        entries.append(_entry(os.path.join(path, step), tarfile.SYMTYPE, comp))
        path = os.path.join(path, comp)
    linkpath = os.path.join(*steps, "l" * 254)
    entries.append(_entry(linkpath, tarfile.SYMTYPE, "../" * len(steps)))
    entries.append(_entry("escape", tarfile.SYMTYPE, linkpath + escape_target_tail))
    return entries


def test_the_review_poc_is_refused_and_the_victim_untouched(
    tmp_path: Path, places: tuple[Path, Path]
) -> None:
    target, victim = places
    entries = [
        *_path_max_chain("/../victim"),
        _entry("flaglink", tarfile.LNKTYPE, "escape/victim.txt"),
        _entry("flaglink"),
    ]
    with pytest.raises(SandboxError):
        extract_archive(_crafted(tmp_path / "evil.tar", *entries), target)
    _untouched(victim)


def test_the_review_evil_tar_itself_is_refused(places: tuple[Path, Path]) -> None:
    evil = Path("/tmp/review2b/evil.tar")  # its escape is out/../victim: our victim
    if not evil.exists():
        pytest.skip("the review's evil.tar is not on this machine (the test above builds it)")
    target, victim = places
    with pytest.raises(SandboxError, match="under the symbolic link"):
        extract_archive(evil, target)
    _untouched(victim)


def test_a_file_through_the_path_max_chain_is_refused(
    tmp_path: Path, places: tuple[Path, Path]
) -> None:
    target, victim = places
    entries = [*_path_max_chain("/../victim"), _entry("escape/victim.txt")]
    with pytest.raises(SandboxError, match="symbolic link"):
        extract_archive(_crafted(tmp_path / "evil.tar", *entries), target)
    _untouched(victim)


def test_links_chained_with_dotdot_are_resolved_as_the_kernel_does(
    tmp_path: Path, places: tuple[Path, Path]
) -> None:
    """``p -> ../..`` from a/b/c leads to ``a``; so ``a/b/c/p/../../../..`` is one level
    above the target, although spelt lexically it ends inside."""
    target, victim = places
    crafted = _crafted(
        tmp_path / "chain.tar",
        _entry("a/b/c/", tarfile.DIRTYPE, mode=0o755),
        _entry("a/b/c/p", tarfile.SYMTYPE, "../.."),
        _entry("out", tarfile.SYMTYPE, "a/b/c/p/../../../../victim"),
        _entry("in", tarfile.SYMTYPE, "a/b/c/p/.."),
        _entry("loop1", tarfile.SYMTYPE, "loop2/x"),
        _entry("loop2", tarfile.SYMTYPE, "loop1/x"),
    )
    done = extract_archive(crafted, target)
    assert not os.path.lexists(target / "out")
    assert not os.path.lexists(target / "loop1") and not os.path.lexists(target / "loop2")
    assert os.readlink(target / "in") == "a/b/c/p/.."
    assert os.path.realpath(target / "in") == str(target)
    assert (done.links, done.links_left_out) == (2, 3)
    _untouched(victim)


@pytest.mark.parametrize(
    "entries",
    [
        [_entry("l", tarfile.SYMTYPE, "../victim"), _entry("l/victim.txt")],
        [_entry("l", tarfile.SYMTYPE, "sub"), _entry("l/f")],  # inside, still refused
        [_entry("d/", tarfile.DIRTYPE), _entry("d", tarfile.SYMTYPE, "../victim")],
        [_entry("d/f"), _entry("d", tarfile.SYMTYPE, "../victim")],
        [_entry("f"), _entry("f/g")],
    ],
    ids=["link-out-then-file", "link-in-then-file", "dir-then-link", "implied-dir-then-link",
         "under-a-file"],
)  # fmt: skip
def test_nothing_is_written_through_a_link_nor_a_directory_swapped_for_one(
    tmp_path: Path, places: tuple[Path, Path], entries: list[tarfile.TarInfo]
) -> None:
    target, victim = places
    with pytest.raises(SandboxError):
        extract_archive(_crafted(tmp_path / "evil.tar", *entries), target)
    _untouched(victim)


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ([_entry("f"), _entry("h", tarfile.LNKTYPE, "f")], "hard link"),
        ([_entry("h", tarfile.LNKTYPE, "../victim/victim.txt")], "hard link"),
        ([_entry("dev", tarfile.CHRTYPE)], "special"),
        ([_entry("blk", tarfile.BLKTYPE)], "special"),
        ([_entry("fifo", tarfile.FIFOTYPE)], "special"),
        ([_entry("../victim/victim.txt")], "climbs"),
        ([_entry("a/../../victim/victim.txt")], "climbs"),
        ([_entry("/abs/escape")], "absolute"),
        ([_entry("f"), _entry("./f")], "twice"),
        ([_entry("d/", tarfile.DIRTYPE), _entry("d", tarfile.DIRTYPE)], "twice"),
        ([_entry("d/", tarfile.DIRTYPE), _entry("d")], "twice"),
        ([_entry("x" * 256)], "longer"),
        ([_entry("./", tarfile.DIRTYPE)], "itself"),
    ],
)  # fmt: skip
def test_what_honest_writers_never_make_refuses_the_archive(
    tmp_path: Path, places: tuple[Path, Path], entries: list[tarfile.TarInfo], reason: str
) -> None:
    target, victim = places
    with pytest.raises(SandboxError, match=reason):
        extract_archive(_crafted(tmp_path / "evil.tar", *entries), target)
    _untouched(victim)
    assert not Path("/abs").exists()


def test_a_repeated_file_never_replaces_the_first(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    with tarfile.open(tmp_path / "twice.tar", "w") as tar:
        for content in (b"first", b"second"):
            entry = _entry("f")
            entry.size = len(content)
            tar.addfile(entry, io.BytesIO(content))
    with pytest.raises(SandboxError, match="twice"):
        extract_archive(tmp_path / "twice.tar", target)
    assert (target / "f").read_bytes() == b"first"


def test_a_name_with_a_nul_byte_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    entry = _entry("placeholder")
    entry.pax_headers = {"path": "a\0b"}
    _crafted(tmp_path / "nul.tar", entry)
    with pytest.raises(SandboxError, match="NUL"):
        extract_archive(tmp_path / "nul.tar", target)


def test_modes_are_masked(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    crafted = _crafted(
        tmp_path / "modes.tar",
        _entry("d/", tarfile.DIRTYPE, mode=0o7777),
        _entry("d/suid", mode=0o6777),
        _entry("d/locked", mode=0o000),
        _entry("ro/", tarfile.DIRTYPE, mode=0o500),
        _entry("ro/f", mode=0o444),
    )
    extract_archive(crafted, target)
    assert stat.S_IMODE((target / "d").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "d" / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "d" / "locked").stat().st_mode) == 0o600
    assert stat.S_IMODE((target / "ro").stat().st_mode) == 0o700  # owner may write: 0o200
    assert (target / "ro" / "f").read_bytes() == b"evil"


def test_past_the_bounds_the_archive_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    crafted = _crafted(tmp_path / "big.tar", _entry("a"), _entry("b"), content=b"0123456789")
    (tmp_path / "t1").mkdir()
    with pytest.raises(SandboxError, match="more than 15 bytes"):
        extract_archive(crafted, tmp_path / "t1", max_bytes=15)
    (tmp_path / "t2").mkdir()
    with pytest.raises(SandboxError, match="more than 1 entries"):
        extract_archive(crafted, tmp_path / "t2", max_entries=1)
    (tmp_path / "t3").mkdir()
    assert extract_archive(crafted, tmp_path / "t3", max_bytes=20).bytes == 20


def test_a_huge_extended_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """tarfile reads a pax header whole (and a read allocates its claimed size first)."""
    entry = _entry("f")
    entry.pax_headers = {"comment": "x" * (2 << 20)}
    _crafted(tmp_path / "pax.tar", entry)
    (tmp_path / "out").mkdir()
    with pytest.raises(SandboxError, match="extended header"):
        extract_archive(tmp_path / "pax.tar", tmp_path / "out")


def test_a_cut_short_archive_is_refused(tmp_path: Path) -> None:
    whole = _crafted(tmp_path / "whole.tar", _entry("f"), content=b"x" * 5000).read_bytes()
    (tmp_path / "cut.tar").write_bytes(whole[:3000])
    (tmp_path / "out").mkdir()
    with pytest.raises(SandboxError, match="not a sound tar"):
        extract_archive(tmp_path / "cut.tar", tmp_path / "out")


def test_an_archive_cut_at_an_entry_boundary_is_refused(tmp_path: Path) -> None:
    """tarfile reads such an archive as whole; without the end marker it is not."""
    whole = _crafted(tmp_path / "whole.tar", _entry("a"), _entry("b")).read_bytes()
    (tmp_path / "cut.tar").write_bytes(whole[: 2 * tarfile.BLOCKSIZE])  # a's header and data
    with tarfile.open(tmp_path / "cut.tar") as tar:
        assert tar.getnames() == ["a"]
    (tmp_path / "out").mkdir()
    with pytest.raises(SandboxError, match="cut short"):
        extract_archive(tmp_path / "cut.tar", tmp_path / "out")


def test_an_honest_tree_round_trips_with_links_out_left_out(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg" / "deep").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("print('hi')\n")
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    (source / "ünïcode name").write_text("x")
    (source / "bad\udcffname").write_text("y")  # not UTF-8 on disk
    os.symlink("pkg/mod.py", source / "inside-link")
    os.symlink("../../run.sh", source / "pkg" / "deep" / "up-link")
    os.symlink("/etc", source / "etc-link")
    os.symlink("../outside", source / "up-out")
    fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (tmp_path / "a.tar").write_bytes(b"".join(tar_stream(fd)))
    finally:
        os.close(fd)
    target = tmp_path / "copy"
    target.mkdir()
    done = extract_archive(tmp_path / "a.tar", target)
    assert (target / "pkg" / "mod.py").read_text() == "print('hi')\n"
    assert os.access(target / "run.sh", os.X_OK)
    assert (target / "ünïcode name").read_text() == "x"
    assert (target / "bad\udcffname").read_text() == "y"
    assert os.readlink(target / "inside-link") == "pkg/mod.py"
    assert (target / "pkg" / "deep" / "up-link").read_text() == "#!/bin/sh\n"
    assert not os.path.lexists(target / "etc-link") and not os.path.lexists(target / "up-out")
    assert (done.files, done.links, done.links_left_out) == (4, 2, 2)
