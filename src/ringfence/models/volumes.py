"""Volumes as the API shows them: a tenant's named, persistent storage with a quota, mounted
into sandboxes at create (``SandboxSpec.volumes``) and read and written without one."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ringfence.models.workstation import VOLUME_NAME_PATTERN

__all__ = ["VOLUME_ID", "Volume", "VolumeEntry", "VolumeSpec"]

VOLUME_ID = r"^vo[0-9a-f]{20}$"


class VolumeSpec(BaseModel):
    """What a volume is created with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=VOLUME_NAME_PATTERN,
        description="Unique among your volumes; what a sandbox's volumes name it by.",
    )
    quota_bytes: int | None = Field(
        None,
        ge=1 << 20,
        description="Bytes it may hold (files and their metadata); default the server's "
        "(RINGFENCE_VOLUME_DEFAULT_BYTES), at most its ceiling (RINGFENCE_VOLUME_MAX_BYTES).",
    )


class Volume(BaseModel):
    """A tenant's volume. It outlives every sandbox that mounts it, and the server."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Unique among every tenant's volumes ('vo' + hex).")
    name: str
    quota_bytes: int = Field(description="Bytes it may hold.")
    created_at: datetime
    used_bytes: int | None = Field(
        None, description="Bytes its files use now (in a volume's info; absent in lists)."
    )


class VolumeEntry(BaseModel):
    """A file or directory in a volume."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str = Field(description="Absolute, from the volume's root ('/' is the root).")
    type: Literal["file", "directory", "symlink", "unknown"]
    size: int
    mode: int = Field(description="Permission bits (and the type's, as stat gives them).")
    uid: int = Field(description="Owner as sandboxes see it (0 root, 1000 the user).")
    gid: int
    mtime: datetime
    atime: datetime
    ctime: datetime
    target: str | None = Field(None, description="A symlink's target, as written.")
