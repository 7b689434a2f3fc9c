"""What any tenant may ask for, whatever the object: limits and timeouts within the
operator's ceilings."""

from __future__ import annotations

from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ResourceLimits

__all__ = ["check_limits", "check_timeout"]


def check_limits(limits: ResourceLimits, config: Config) -> None:
    """Raises ``InvalidRequest`` for a limit above the operator's ceiling."""
    ceilings = config.max_limits
    for name in ("memory", "pids", "cpus", "disk"):
        asked, most = getattr(limits, name), getattr(ceilings, name)
        if asked is not None and most is not None and asked > most:
            raise InvalidRequest(f"limits.{name}: {asked} is above this server's {most}")


def check_timeout(timeout: float | None, config: Config) -> None:
    """Raises ``InvalidRequest`` for a timeout above the operator's ceiling."""
    if timeout is not None and timeout > config.max_timeout:
        raise InvalidRequest(
            f"timeout: {timeout:g} s is above this server's {config.max_timeout:g} s"
        )
