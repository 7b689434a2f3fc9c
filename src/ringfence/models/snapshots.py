"""Sandbox state as the API shows it: checkpoints of a running sandbox, snapshots (persisted
checkpoints a tenant owns and starts new sandboxes from), and what pause and fork answer."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ringfence.models.sandboxes import Sandbox

__all__ = [
    "CHECKPOINT_ID",
    "MAX_FORK_CHILDREN",
    "SNAPSHOT_ID",
    "CheckpointInfo",
    "Forked",
    "Paused",
    "Snapshot",
]

CHECKPOINT_ID = r"^ck[0-9a-f]{1,64}$"
SNAPSHOT_ID = r"^sn[0-9a-f]{20}$"
MAX_FORK_CHILDREN = 16  # children of one fork: each is a whole sandbox, budgeted as one


class CheckpointInfo(BaseModel):
    """One checkpoint of a running sandbox's files (held on the host, for rollback)."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Unique within its sandbox ('ck' + hex).")
    created_at: datetime
    files: int = Field(description="Entries captured (files, directories, links).")
    bytes: int = Field(description="Bytes it holds that no earlier checkpoint shares.")
    memory: bool = Field(False, description="Process memory captured too (else files only).")


class Snapshot(BaseModel):
    """A sandbox's files persisted on the server's disk, owned by a tenant: new sandboxes
    start from it (``SandboxSpec.snapshot``). Its processes are not in it: they start
    fresh."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Unique among every tenant's snapshots ('sn' + hex).")
    sandbox_id: str = Field(description="The sandbox it was taken of.")
    template: str = Field(description="The template under its files (its sandboxes' too).")
    created_at: datetime
    files: int = Field(description="Entries captured (files, directories, links).")
    bytes: int = Field(description="Bytes of its files.")
    metadata: dict[str, str] = Field(
        default_factory=dict, description="The metadata of the sandbox it was taken of."
    )


class Paused(BaseModel):
    """What a pause did."""

    model_config = ConfigDict(frozen=True)

    sandbox: Sandbox
    memory: bool = Field(
        description="True: its processes are stopped with their memory held and go on where "
        "they were on resume. False: only its files were kept; its processes start again on "
        "resume (memory freed)."
    )


class Forked(BaseModel):
    """What a fork made: the children, each a new sandbox from one checkpoint of the
    parent (files only: their processes start fresh)."""

    model_config = ConfigDict(frozen=True)

    parent: str = Field(description="The sandbox forked.")
    children: Annotated[list[Sandbox], Field(min_length=1, max_length=MAX_FORK_CHILDREN)]
