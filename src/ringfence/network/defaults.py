"""Which policy applies: the one given, else the tenant's default, else none."""

from __future__ import annotations

from ringfence.config import Config
from ringfence.models import NetworkPolicy

__all__ = ["policy_for"]


def policy_for(tenant: str, given: NetworkPolicy | None, config: Config) -> NetworkPolicy:
    """The policy a sandbox or execution of ``tenant`` gets when it asked for ``given``:
    given wins; else ``network_defaults[tenant]``, then ``network_defaults["*"]``; else no
    network."""
    if given is not None:
        return given
    defaults = config.network_defaults
    return defaults.get(tenant) or defaults.get("*") or NetworkPolicy()
