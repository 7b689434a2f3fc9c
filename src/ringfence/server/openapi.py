"""The OpenAPI document states this server's own bounds, not only the models'.

The models bound every field by what can work anywhere (a sandbox's floors, what the kernel
and the store can hold); the operator's configuration narrows some of them per server (the
largest limits and timeout, whether host mounts or other images may be asked for). A
request the document calls valid is one this server accepts, as far as its form goes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ringfence.config import Config
from ringfence.models import MAX_TIMEOUT_SECONDS

__all__ = ["with_server_bounds"]

_LIMIT_SCHEMAS = ("ResourceLimits", "SandboxLimits")


def with_server_bounds(document: dict[str, Any], config: Config) -> dict[str, Any]:
    """``document`` (FastAPI's OpenAPI dict) narrowed to ``config``'s ceilings, in place."""
    ceilings = config.max_limits
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        properties: dict[str, Any] = schema.get("properties", {})
        if name.split("-")[0] in _LIMIT_SCHEMAS:
            for field, most in ceilings.model_dump(exclude_none=True).items():
                if field in properties:
                    _narrow(properties[field], functools.partial(_at_most, most=most))
        if "timeout" in properties:
            _narrow(properties["timeout"], functools.partial(_timeout_at_most, config=config))
        if "mounts" in properties and not config.allow_tenant_mounts:
            properties["mounts"]["maxItems"] = 0
            properties["mounts"]["description"] += " Not allowed on this server."
        if "image" in properties and not config.allow_tenant_images:
            properties["image"]["anyOf"] = [{"const": config.default_image}, {"type": "null"}]
    return document


def _narrow(schema: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to each numeric branch of ``schema`` (a value or ``anyOf`` null)."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") in ("integer", "number"):
            change(branch)


def _at_most(branch: dict[str, Any], most: float) -> None:
    branch["maximum"] = min(branch.get("maximum", most), most)


def _timeout_at_most(branch: dict[str, Any], config: Config) -> None:
    # Only the timeouts the server checks against its ceiling carry the models' maximum.
    if branch.get("maximum") == MAX_TIMEOUT_SECONDS:
        branch["maximum"] = min(config.max_timeout, MAX_TIMEOUT_SECONDS)
