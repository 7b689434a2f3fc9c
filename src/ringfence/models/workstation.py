"""What a sandbox is given beyond its template at create: named volumes, a host project
directory (a copy-on-write view), a network group, public traffic to its ports
(docs/design.md, "The agent's workstation")."""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["GROUP_PATTERN", "VOLUME_NAME_PATTERN", "ProjectMount", "VolumeMount"]

VOLUME_NAME_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$"
GROUP_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
# Sandbox paths a volume or project may not cover: the sandbox's own plumbing.
_RESERVED = ("/", "/proc", "/dev", "/sys", "/run", "/usr", "/etc", "/bin", "/sbin", "/lib")


def _sandbox_path(path: str) -> str:
    if "\0" in path or not path.startswith("/"):
        raise ValueError(f"must be an absolute path: {path!r}")
    if ".." in path.split("/"):
        raise ValueError(f"must not contain '..': {path!r}")
    path = posixpath.normpath(path)
    for reserved in _RESERVED:
        if path == reserved or (reserved != "/" and path.startswith(reserved + "/")):
            raise ValueError(f"cannot mount over {reserved}: it belongs to the sandbox")
    return path


class VolumeMount(BaseModel):
    """A named volume of the tenant's, mounted at ``path`` for the sandbox's life."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=VOLUME_NAME_PATTERN, description="The volume's name.")
    path: str = Field(description="Absolute path inside the sandbox.")
    read_only: bool = Field(False, description="Mount it read-only.")

    _path = field_validator("path")(classmethod(lambda cls, path: _sandbox_path(path)))


class ProjectMount(BaseModel):
    """A host directory shown inside the sandbox as a copy-on-write view: the sandbox's
    writes land in its own layer (read back with diff, applied with sync), the host's
    files stay untouched."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="Absolute path of the directory on the server's host.")
    path: str = Field("/home/user/project", description="Absolute path inside the sandbox.")

    @field_validator("source")
    @classmethod
    def _absolute(cls, source: str) -> str:
        if "\0" in source or not source.startswith("/"):
            raise ValueError(f"must be an absolute path: {source!r}")
        if ".." in source.split("/"):
            raise ValueError(f"must not contain '..': {source!r}")
        return posixpath.normpath(source)

    _path = field_validator("path")(classmethod(lambda cls, path: _sandbox_path(path)))
