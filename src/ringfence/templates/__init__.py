"""Templates: read-only root filesystems that sandboxes start from.

A template is built from Debian packages (``build_template``) or imported from a
``docker save`` archive (``import_template``), and lives in the templates directory
(``templates_dir``). The sandbox service turns a template name into the root filesystem a
sandbox runs on with ``resolve``; the local backend binds it read-only.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from ringfence.config import Config
from ringfence.templates.registry import (
    Registry,
    Template,
    TemplateNotFound,
    TemplateUnusable,
    check_name,
    templates_dir,
)

__all__ = [
    "DAEMON_PYTHON",
    "Registry",
    "Template",
    "TemplateNotFound",
    "TemplateUnusable",
    "check_name",
    "has_program",
    "import_template",
    "resolve",
    "templates_dir",
]


# What an interactive sandbox's daemon runs on: the template's own python3.
DAEMON_PYTHON = "/usr/bin/python3"
_MAX_LINKS = 40  # as the kernel's path walk allows


def has_program(rootfs: Path, path: str) -> bool:
    """Whether ``path`` names an executable file inside ``rootfs``, following its symbolic
    links as the sandbox would see them (an absolute link starts again at ``rootfs``)."""
    todo = list(PurePosixPath(path).parts[1:])
    here = PurePosixPath("/")
    links = 0
    while todo:
        name = todo.pop(0)
        if name == "..":
            here = here.parent
            continue
        on_host = rootfs / (here / name).relative_to("/")
        if on_host.is_symlink():
            links += 1
            if links > _MAX_LINKS:
                return False
            target = PurePosixPath(os.readlink(on_host))
            if target.is_absolute():
                here, todo = PurePosixPath("/"), [*target.parts[1:], *todo]
            else:
                todo = [*target.parts, *todo]
            continue
        here = here / name
    found = rootfs / here.relative_to("/")
    return found.is_file() and os.access(found, os.X_OK)


def resolve(name: str, config: Config) -> str:
    """The root filesystem of template ``name``, as an ``ExecutionRequest.image``.

    Checked at every call: the template is complete, nobody but Ringfence's user can change
    it, and the sandbox user can reach it from ``/``.

    Raises:
        InvalidRequest: ``name`` is not a valid template name.
        TemplateNotFound: no template has that name (its message lists the known ones).
        TemplateUnusable: the sandbox user could not reach it, or others could change it.
    """
    return str(Registry.for_config(config).resolve(name))


def import_template(config: Config, name: str, archive: Path, *, replace: bool = False) -> Template:
    """Import ``archive`` (``docker save`` output, or an OCI image layout in a tar) as
    template ``name``.

    Raises:
        InvalidRequest: a bad name, the template exists, or the archive is not a usable
            image (not a tar, no manifest, missing or corrupt layers, an entry that tries to
            leave the root filesystem).
    """
    from ringfence.templates.archive import import_archive

    registry = Registry.for_config(config)
    with registry.staging(name, replace=replace) as staging:
        metadata = import_archive(archive.resolve(), staging / "rootfs")
        return registry.install(staging, name, metadata, replace=replace)
