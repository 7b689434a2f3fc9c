"""Building a template from Debian packages: debootstrap, then apt-get in a chroot.

Everything runs as root on the host, never inside a sandbox, each step in a private mount
namespace of its own (``unshare --mount``): the ``/proc`` and the package cache it mounts in
the new root disappear with it, even if the build is killed. Downloads are cached under
``/var/cache/ringfence`` (debootstrap's ``--cache-dir`` for the base system, the chroot's
``/var/cache/apt/archives`` bound to the host's cache for the rest), so a second build
downloads only the package indexes. One build runs at a time (a lock on the cache).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ringfence.errors import InvalidRequest, RingfenceError
from ringfence.templates.registry import ROOTFS, Registry, Template

__all__ = [
    "CACHE_DIR",
    "DEFAULT_MIRROR",
    "KEYRING",
    "PYPI_RECIPES",
    "RECIPES",
    "BuildFailed",
    "Progress",
    "build_template",
    "host_mirror",
    "strip_setuid",
]

CACHE_DIR = Path("/var/cache/ringfence")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What debootstrap checks the suite's Release signature against (--force-check-gpg: a
# missing or failed signature stops the build, never a warning over plain HTTP).
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
_BASE = ("python3", "python3-pip", "python3-venv", "git", "curl", "jq", "ca-certificates", "nodejs")
# A coding agent's workstation: git and the GitHub CLI, Python with pip (and uv, from
# PyPI below), Node.js with npm, Go, a C toolchain.
_DEV = (*_BASE, "gh", "npm", "golang-go", "build-essential", "procps", "less", "unzip")
RECIPES: dict[str, tuple[str, ...]] = {
    "minbase": (),  # debootstrap's minbase alone (no python3: the daemon cannot run in it)
    "base": _BASE,
    "code-interpreter": (*_BASE, "python3-numpy", "python3-pandas", "python3-matplotlib"),
    "dev": _DEV,
    # Chromium for the browser sandbox (docs/browser.md), with fonts that cover Latin,
    # Greek and Cyrillic text in the screenshots; the Markdown converter comes from PyPI.
    "browser": (*_BASE, "chromium", "fonts-liberation", "fonts-dejavu-core"),
}
# What a recipe adds from PyPI once its Debian packages are in (pinned; wheels only),
# installed with the template's own pip under /usr/local, beside Debian's Python.
PYPI_RECIPES: dict[str, tuple[str, ...]] = {
    "dev": ("uv==0.13.8",),
    "browser": ("html-to-markdown==3.19.0",),
}
_PYPI_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.]+$")
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")  # Debian policy 5.6.1
_SUITE = re.compile(r"^[a-z][a-z0-9-]*$")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BuildFailed(RingfenceError):
    """debootstrap or apt-get failed; the message ends with the tail of their output."""

    code = "template_build_failed"


def host_mirror(sources: Iterable[Path] | None = None) -> str | None:
    """The Debian archive this machine's apt uses (not its security archive), if any."""
    if sources is None:
        directory = Path("/etc/apt/sources.list.d")
        extra = sorted(directory.glob("*.sources")) + sorted(directory.glob("*.list"))
        sources = [Path("/etc/apt/sources.list"), *extra]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri in _uris(text):
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    return None


def _uris(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words[:1] == ["deb"]:
            found += [w for w in words[1:] if "://" in w][:1]
        elif words[:1] == ["URIs:"]:
            found += words[1:]
    return found


_PER_PACKAGE: Mapping[str, str] = {
    "I: Retrieving": "retrieving packages",
    "I: Validating": "validating packages",
    "I: Extracting": "extracting packages",
    "I: Unpacking": "unpacking packages",
    "I: Configuring": "configuring packages",
    "Get:": "downloading packages",
    "Selecting": "unpacking packages",
    "Preparing": "unpacking packages",
    "Unpacking": "unpacking packages",
    "Setting": "configuring packages",
    "Processing": "configuring packages",
    "Collecting": "collecting packages",
    "Downloading": "downloading packages",
    "Installing": "installing packages",
}
_PASS = re.compile(
    r"^(I: |W: |E: |Err:|ERROR: |\d+ upgraded|Fetched |Successfully (installed|downloaded) |Saved )"
)
_INDEXES = frozenset({"InRelease", "Release", "Release.gpg", "Packages"})


class Progress:
    """Condenses debootstrap's and apt-get's output to one line per stage.

    Lines per package ("I: Retrieving zlib1g 1:1.2.13", "Setting up git ...") become one
    line when that stage is first seen; stage lines, warnings and errors pass through. The last
    lines are kept whole for the error message if the step fails.
    """

    def __init__(self, emit: Callable[[str], None], step: str) -> None:
        self._emit = emit
        self._step = step
        self._seen: set[str] = set()
        self.tail: deque[str] = deque(maxlen=30)

    def feed(self, line: str) -> None:
        line = line.rstrip()
        if not line:
            return
        self.tail.append(line)
        words = line.split()
        key = " ".join(words[:2]) if line.startswith("I: ") else words[0]
        if line.startswith("Get:"):
            key = "Get:"
        stage = _PER_PACKAGE.get(key)
        if stage and not (len(words) == 3 and words[2] in _INDEXES):
            if stage not in self._seen:  # stages interleave (retrieve, validate, retrieve...)
                self._seen.add(stage)
                self._emit(f"{self._step}: {stage}")
            return
        if _PASS.match(line):
            self._emit(f"{self._step}: {line.removeprefix('I: ')}")


def build_template(
    registry: Registry,
    name: str,
    packages: Sequence[str],
    *,
    recipe: str = "",
    suite: str = "bookworm",
    mirror: str | None = None,
    cache_dir: Path = CACHE_DIR,
    on_progress: Callable[[str], None] = lambda _: None,
    replace: bool = False,
    pypi: Sequence[str] = (),
) -> Template:
    """Build template ``name``: Debian ``suite`` (minbase) plus ``packages``, then the
    pinned PyPI wheels ``pypi`` ("uv==0.13.8") with the template's own pip.

    Raises:
        InvalidRequest: a bad name, package, requirement, suite or mirror, or the template
            exists.
        BuildFailed: not root, debootstrap missing, or a step failed.
    """
    for package in packages:
        if not _PACKAGE.match(package):
            raise InvalidRequest(f"{package!r} is not a Debian package name")
    for requirement in pypi:
        if not _PYPI_REQUIREMENT.match(requirement):
            raise InvalidRequest(f"{requirement!r}: give a pinned PyPI requirement, NAME==VERSION")
    if pypi and "python3-pip" not in packages:
        raise InvalidRequest("PyPI packages need python3-pip among the Debian packages")
    if not _SUITE.match(suite):
        raise InvalidRequest(f"{suite!r} is not a Debian suite name")
    mirror = mirror or host_mirror() or DEFAULT_MIRROR
    if not re.match(r"^https?://[^\s'\"]+$", mirror):
        raise InvalidRequest(f"mirror {mirror!r}: give an http:// or https:// URL")
    if os.geteuid() != 0:
        raise BuildFailed("building a template needs root (debootstrap and chroot)")
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise BuildFailed("debootstrap is not installed (apt-get install debootstrap)")
    if not Path(KEYRING).is_file():  # fail closed: never install packages nobody signed
        raise BuildFailed(
            f"{KEYRING} is missing: debootstrap checks the suite's signature against it "
            "(apt-get install debian-archive-keyring)"
        )
    cache_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    started = time.monotonic()
    with open(cache_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with registry.staging(name, replace=replace) as staging:
            rootfs = staging / ROOTFS
            rootfs.mkdir(mode=0o755)
            debs = cache_dir / "debootstrap" / suite
            debs.mkdir(parents=True, exist_ok=True)
            _run(
                [
                    "unshare", "--mount", "--propagation", "private",
                    debootstrap, "--variant=minbase", "--components=main",
                    "--force-check-gpg", f"--keyring={KEYRING}",
                    f"--cache-dir={debs}", suite, str(rootfs), mirror,
                ],
                Progress(on_progress, "debootstrap"),
                "debootstrap",
            )  # fmt: skip
            _install_packages(rootfs, packages, suite, mirror, cache_dir, on_progress, pypi)
            on_progress("template: cleaning up and sealing")
            _clean(rootfs)
            stripped = strip_setuid(rootfs)
            private = private_files(rootfs)
            if private:
                on_progress(
                    f"template: warning: {len(private)} entries are not world-readable "
                    f"({', '.join(private[:5])}{', ...' if len(private) > 5 else ''}): the "
                    "sandbox's root owns the template's files (idmapped lower layers) and "
                    "can read them all, so a template must hold no secret"
                )
            metadata: dict[str, Any] = {
                "source": "build",
                "recipe": recipe,
                "packages": list(packages),
                "pypi": list(pypi),
                "suite": suite,
                "mirror": mirror,
                "variant": "minbase",
                "stripped_setuid": stripped,
                "build_seconds": round(time.monotonic() - started, 1),
            }
            return registry.install(staging, name, metadata, replace=replace)


_CHROOT_SCRIPT = r"""
set -e
root=$1 archives=$2; shift 2
mount -t proc proc "$root/proc"
mount --bind "$archives" "$root/var/cache/apt/archives"
# unsafe-io: no fsync per file; a build that dies is thrown away whole anyway
exec chroot "$root" /usr/bin/env -i PATH="$PATH" DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
  APT_OPTS="-o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-unsafe-io" \
  /bin/sh -ec 'apt-get update -q
apt-get -y -q $APT_OPTS upgrade
apt-get install -y -q $APT_OPTS --no-install-recommends "$@"' sh "$@"
"""


_PIP_SCRIPT = r"""
set -e
root=$1 cache=$2; shift 2
mount -t proc proc "$root/proc"
mount --bind "$cache" "$root/var/cache/ringfence-pip"
exec chroot "$root" /usr/bin/env -i PATH="$PATH" LANG=C.UTF-8 HOME=/root \
  PIP_DISABLE_PIP_VERSION_CHECK=1 /usr/bin/python3 -m pip install --progress-bar off \
  --break-system-packages --root-user-action=ignore --no-warn-script-location --no-cache-dir \
  --no-index --find-links /var/cache/ringfence-pip --only-binary=:all: "$@"
"""


def _install_packages(
    rootfs: Path,
    packages: Sequence[str],
    suite: str,
    mirror: str,
    cache_dir: Path,
    on_progress: Callable[[str], None],
    pypi: Sequence[str] = (),
) -> None:
    if not packages:
        return
    etc = rootfs / "etc"
    lines = [f"deb {mirror} {suite} main", f"deb {mirror} {suite}-updates main"]
    if mirror.endswith("/debian"):
        lines.append(f"deb {mirror}-security {suite}-security main")
    (etc / "apt" / "sources.list").write_text("\n".join(lines) + "\n")
    resolv = etc / "resolv.conf"
    resolv.unlink(missing_ok=True)
    resolv.write_bytes(Path("/etc/resolv.conf").read_bytes())  # apt resolves the mirror
    policy = rootfs / "usr" / "sbin" / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")  # no service starts inside the build
    policy.chmod(0o755)
    archives = cache_dir / "apt-archives"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    try:
        _run(
            ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
             _CHROOT_SCRIPT, "sh", str(rootfs), str(archives), *packages],
            Progress(on_progress, "apt-get"),
            "apt-get in the new root",
        )  # fmt: skip
        if pypi:
            _install_pypi(rootfs, pypi, cache_dir, on_progress)
    finally:
        policy.unlink(missing_ok=True)
        resolv.unlink(missing_ok=True)


def _install_pypi(
    rootfs: Path, pypi: Sequence[str], cache_dir: Path, on_progress: Callable[[str], None]
) -> None:
    """The pinned wheels into ``/usr/local`` with the new root's pip, offline (Debian's pip
    installs there as root: its scheme adds ``/local``, so no ``--prefix``, which it would
    make ``/usr/local/local``); Debian's own Python stays untouched. The wheels are
    fetched by the host's pip first (its index, proxy and certificates: the new root knows
    none of this host's settings), into ``cache_dir/pip``, bound into the new root for the
    install."""
    cache = cache_dir / "pip"
    cache.mkdir(parents=True, exist_ok=True)
    _download_wheels(pypi, cache, Progress(on_progress, "pip download"))
    mountpoint = rootfs / "var" / "cache" / "ringfence-pip"
    mountpoint.mkdir()
    try:
        _run(
            ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
             _PIP_SCRIPT, "sh", str(rootfs), str(cache), *pypi],
            Progress(on_progress, "pip"),
            "pip in the new root",
        )  # fmt: skip
    finally:
        mountpoint.rmdir()  # its mount went with the namespace


def _download_wheels(pypi: Sequence[str], cache: Path, progress: Progress) -> None:
    """``pip download`` of the pinned requirements, wheels only, no dependencies beyond
    what they pin (a recipe pins each one it needs), with this host's pip settings."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--progress-bar", "off", "-d", str(cache), *pypi]  # fmt: skip
    try:
        with subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace",
        ) as process:  # fmt: skip
            assert process.stdout is not None
            for line in process.stdout:
                progress.feed(line)
    except OSError as exc:
        raise BuildFailed(f"cannot run pip download: {exc.strerror}") from exc
    if process.returncode != 0:
        tail = "\n".join(progress.tail)
        raise BuildFailed(f"pip download of {', '.join(pypi)} failed (needs pip beside "
                          f"Ringfence, and PyPI or this host's index):\n{tail}")  # fmt: skip


def _clean(rootfs: Path) -> None:
    for directory in ("var/lib/apt/lists", "var/cache/apt/archives", "var/log/apt"):
        for entry in (rootfs / directory).glob("*"):
            if entry.is_file() or entry.is_symlink():
                entry.unlink()
    for entry in (rootfs / "var/cache/apt").glob("*.bin"):
        entry.unlink()
    for entry in (rootfs / "var/cache/debconf").glob("*-old"):
        entry.unlink()


def private_files(root: Path) -> list[str]:
    """The files and directories under ``root`` that others may not read, as paths inside
    the template, sorted. Every sandbox's root can read them anyway (the idmapped lower
    layers make it their owner): what a build warns about."""
    found = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            if (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) and not (
                st.st_mode & stat.S_IROTH
            ):
                found.append("/" + os.path.relpath(path, root))
    return sorted(found)


def strip_setuid(root: Path) -> int:
    """Clear setuid and setgid bits under ``root`` (mounts are nosuid anyway: this makes
    the template say so). Returns how many files had one."""
    count = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                count += 1
    return count


def _run(argv: list[str], progress: Progress, what: str) -> None:
    env = {"PATH": _PATH, "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    try:
        with subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, text=True, errors="replace",
        ) as process:  # fmt: skip
            assert process.stdout is not None
            for line in process.stdout:
                progress.feed(line)
    except OSError as exc:
        raise BuildFailed(f"cannot run {argv[0]}: {exc.strerror}") from exc
    if process.returncode != 0:
        tail = "\n".join(progress.tail)
        raise BuildFailed(f"{what} failed (exit {process.returncode}):\n{tail}")
