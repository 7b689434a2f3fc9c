"""Host paths granted to a sandbox."""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Mount"]

# Sandbox paths a mount may not cover: the sandbox's own plumbing.
_RESERVED_TARGETS = ("/", "/proc", "/dev", "/sys")


class Mount(BaseModel):
    """A host path made visible inside the sandbox. Read-only unless ``writable``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="Absolute path on the host.")
    target: str = Field(description="Absolute path inside the sandbox.")
    writable: bool = Field(False, description="Mount read-write instead of read-only.")

    @field_validator("source", "target")
    @classmethod
    def _absolute_and_normal(cls, path: str) -> str:
        if "\0" in path or not path.startswith("/"):
            raise ValueError(f"must be an absolute path: {path!r}")
        if ".." in path.split("/"):
            raise ValueError(f"must not contain '..': {path!r}")
        return posixpath.normpath(path)

    @field_validator("target")
    @classmethod
    def _not_reserved(cls, target: str) -> str:
        for reserved in _RESERVED_TARGETS:
            if target == reserved or (reserved != "/" and target.startswith(reserved + "/")):
                raise ValueError(f"cannot mount over {reserved}: it belongs to the sandbox")
        return target

    @classmethod
    def parse(cls, spec: str) -> Mount:
        """Parse the CLI form ``HOST:SANDBOX[:ro|rw]``.

        Raises:
            ValueError: the form or a path is invalid.
        """
        parts = spec.split(":")
        mode = "ro"
        if len(parts) == 3:
            mode = parts.pop()
        if len(parts) != 2 or mode not in ("ro", "rw"):
            raise ValueError(f"mount must be HOST:SANDBOX[:ro|rw], got {spec!r}")
        return cls(source=parts[0], target=parts[1], writable=mode == "rw")
