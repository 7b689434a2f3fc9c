"""Where templates live, and what makes one usable: names, metadata, permissions, install.

A template is ``<templates dir>/<name>/`` holding ``rootfs/`` (the root filesystem, owned by
root, never writable by anyone else) and ``template.json`` (how it was made). The templates
directory is *not* under the data directory: that one is 0700 (it holds the database and the
admin key), and every sandbox binds a template's files as the unprivileged sandbox user, who
must be able to walk the path from ``/`` to them. It is the data directory's sibling
``ringfence-templates`` (``/var/lib/ringfence-templates`` for root), or the ``templates_dir``
setting once the configuration has one.

New templates are made in a ``.build-*`` directory beside their final place and renamed into
it, so a template is either whole or absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ringfence.backends.local.rootfs import GENERATED_ETC
from ringfence.config import Config
from ringfence.errors import InvalidRequest, NotFound, RingfenceError, SandboxError

__all__ = [
    "Registry",
    "Template",
    "TemplateNotFound",
    "TemplateUnusable",
    "check_name",
    "templates_dir",
]

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
METADATA = "template.json"
ROOTFS = "rootfs"


class TemplateNotFound(NotFound):
    """No template with this name has been built or imported."""


class TemplateUnusable(SandboxError):
    """The template exists but a sandbox could not use it safely (permissions of its path)."""


@dataclass(frozen=True)
class Template:
    """A built or imported template: its name, its root filesystem and how it was made."""

    name: str
    rootfs: Path
    metadata: dict[str, Any]


def templates_dir(config: Config) -> Path:
    """The directory that holds every template for ``config``."""
    if config.templates_dir is not None:
        return config.templates_dir
    return config.data_dir.parent / "ringfence-templates"


def check_name(name: str) -> str:
    """``name`` if it is a DNS label (lowercase letters, digits, inner hyphens, 1-63 long).

    Raises:
        InvalidRequest: it is not.
    """
    if not _NAME.match(name):
        raise InvalidRequest(
            f"template name {name!r}: use 1-63 lowercase letters, digits and inner hyphens"
        )
    return name


class Registry:
    """The templates under one directory."""

    def __init__(self, root: Path, *, sandbox_uid: int | None = None) -> None:
        """``sandbox_uid``: the host uid sandboxes run as (checked to reach the templates);
        None means our own uid (Ringfence not run as root)."""
        self.root = root
        self._uid = sandbox_uid

    @classmethod
    def for_config(cls, config: Config) -> Registry:
        # Any uid of the range: none owns a template, so "other" permissions decide for all.
        uid = config.sandbox_uids[0] if os.geteuid() == 0 else None
        return cls(templates_dir(config), sandbox_uid=uid)

    def get(self, name: str) -> Template:
        """The template ``name``.

        Raises:
            InvalidRequest: the name is not a valid template name.
            TemplateNotFound: there is no such template.
        """
        directory = self.root / check_name(name)
        try:
            metadata = json.loads((directory / METADATA).read_text())
        except FileNotFoundError:
            raise TemplateNotFound(self._not_found(name)) from None
        except (OSError, ValueError) as exc:
            raise TemplateUnusable(f"template {name!r}: unreadable {METADATA}: {exc}") from exc
        return Template(name, directory / ROOTFS, metadata)

    def resolve(self, name: str) -> Path:
        """The root filesystem of ``name``, checked to be safe and reachable for a sandbox.

        Raises:
            InvalidRequest: the name is not a valid template name.
            TemplateNotFound: there is no such template.
            TemplateUnusable: the sandbox user could not reach it, or others could change it.
        """
        template = self.get(name)
        self._check_path(template.rootfs)
        return template.rootfs

    def list(self) -> list[Template]:
        """Every complete template, by name (builds in progress are not listed)."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in sorted(self.root.iterdir()):
            if _NAME.match(entry.name) and (entry / METADATA).is_file():
                try:
                    found.append(self.get(entry.name))
                except RingfenceError:
                    continue
        return found

    def remove(self, name: str) -> None:
        """Delete ``name``. A sandbox still running from it sees its files disappear.

        Raises:
            TemplateNotFound: there is no such template.
        """
        template = self.get(name)
        directory = template.rootfs.parent
        # Renamed out of the way first: the name is free at once, and a half-deleted template
        # is never listed or resolved.
        trash = Path(tempfile.mkdtemp(prefix=f".rm-{name}-", dir=self.root))
        directory.rename(trash / name)
        remove_tree(trash)

    @contextmanager
    def staging(self, name: str, *, replace: bool = False) -> Iterator[Path]:
        """A fresh directory to make ``name`` in, installed as the template when the block
        ends without an error (and deleted otherwise). Write ``rootfs/`` into it; the
        metadata is written by ``install``.

        Raises:
            InvalidRequest: ``name`` is invalid, or exists and ``replace`` is false.
        """
        check_name(name)
        if not replace and (self.root / name).exists():
            raise InvalidRequest(f"template {name!r} exists; remove it first (or replace it)")
        self.prepare()
        staging = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=self.root))
        try:
            staging.chmod(0o755)
            yield staging
        except BaseException:
            remove_tree(staging)
            raise

    def install(
        self, staging: Path, name: str, metadata: dict[str, Any], *, replace: bool = False
    ) -> Template:
        """Seal ``staging`` (made by ``staging``) and rename it into place as ``name``.

        Raises:
            InvalidRequest: ``name`` appeared meanwhile and ``replace`` is false.
        """
        rootfs = staging / ROOTFS
        rootfs.chmod(0o755)
        _placeholders(rootfs)
        metadata = {
            "name": name,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "size_bytes": tree_size(rootfs),
            **metadata,
        }
        (staging / METADATA).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")
        (staging / METADATA).chmod(0o644)
        final = self.root / name
        if replace and final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".rm-{name}-", dir=self.root))
            final.rename(old / name)
            staging.rename(final)
            remove_tree(old)
        else:
            try:
                staging.rename(final)  # fails if a non-empty directory of that name appeared
            except OSError as exc:
                raise InvalidRequest(f"template {name!r} exists; remove it first") from exc
        return Template(name, final / ROOTFS, metadata)

    def prepare(self) -> None:
        """Create the templates directory (0755, ours) and check it.

        Raises:
            TemplateUnusable: it belongs to someone else or others may write it.
        """
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._check_ours(self.root)

    def _check_path(self, rootfs: Path) -> None:
        self._check_ours(self.root)
        for directory in (self.root, self.root / rootfs.parent.name, rootfs):
            self._check_ours(directory)
        uid = os.geteuid() if self._uid is None else self._uid
        for directory in [*reversed(rootfs.parents), rootfs]:
            st = directory.stat()
            bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXOTH
            if not st.st_mode & bit:
                raise TemplateUnusable(
                    f"the sandbox user (uid {uid}) cannot enter {directory} (mode "
                    f"{stat.filemode(st.st_mode)}), so it cannot use templates under "
                    f"{self.root}: keep them in a directory every parent of which others may "
                    "enter (o+x), such as /var/lib/ringfence-templates"
                )

    def _check_ours(self, directory: Path) -> None:
        # What a template holds runs as every sandbox made from it: nobody but us may have
        # been able to change it.
        st = directory.lstat()
        if not stat.S_ISDIR(st.st_mode):
            raise TemplateUnusable(f"{directory} is not a directory (a symlink?)")
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise TemplateUnusable(
                f"{directory} belongs to uid {st.st_uid} or is writable by others: "
                "a template must be changeable by Ringfence's own user only"
            )

    def _not_found(self, name: str) -> str:
        known = ", ".join(t.name for t in self.list()) or "none"
        return f"no template {name!r} in {self.root} (known: {known})"


def _placeholders(rootfs: Path) -> None:
    """Empty ``etc/passwd``, ``group``, ``hosts``, ``hostname`` where the image lacks them:
    the local backend binds its generated files only over files that exist (it cannot
    create one in a read-only ``/etc``), and without them the sandbox user has no name."""
    etc = rootfs / "etc"
    if etc.is_symlink():
        return
    etc.mkdir(mode=0o755, exist_ok=True)
    for name in GENERATED_ETC:
        path = etc / name
        if not os.path.lexists(path):
            path.touch(mode=0o644)
            path.chmod(0o644)


def tree_size(root: Path) -> int:
    """Bytes used by the files under ``root`` (hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(directory, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def remove_tree(path: Path) -> None:
    """Delete ``path``, refusing if anything is mounted below it (a build's /proc, say):
    deleting through a mount would delete what it shows.

    Raises:
        TemplateUnusable: something is mounted below ``path``.
    """
    prefix = str(path.resolve()).rstrip("/") + "/"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mountpoint = line.split()[4].replace("\\040", " ")
        if mountpoint.startswith(prefix):
            raise TemplateUnusable(f"{mountpoint} is still mounted; not deleting {path}")
    shutil.rmtree(path, ignore_errors=True)
