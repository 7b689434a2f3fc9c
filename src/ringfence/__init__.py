"""Ringfence: a self-hosted sandbox runtime for AI agents.

What this package offers, by who uses it:

- Agents and their authors, the SDK (shaped like E2B's, ``from ringfence import Sandbox``):
  ``Sandbox`` / ``AsyncSandbox`` (interactive sandboxes: commands, files, code contexts) and
  ``Ringfence`` / ``AsyncRingfence`` (one-shot executions and proposals), with the errors
  their calls raise. They live in ``ringfence.client`` and are imported on first use, so
  ``import ringfence`` loads neither httpx nor the client.
- Programs that run commands on this host without a server, the executor:
  ``create_executor(Config())`` and the ``ExecutionRequest`` / ``ExecutionResult`` it takes
  and gives.
- Both: the error tree (``RingfenceError``, every class with a stable ``code``).

``Sandbox`` here is the SDK's live sandbox, as ``e2b.Sandbox`` is; the server's record of a
sandbox is ``ringfence.models.Sandbox`` (``SandboxInfo`` in the SDK).

Layers, an import only going downwards: the entry points (``server``, ``server.e2b``,
``mcp``, ``cli``) -> ``service`` -> ``backends``, ``store``, ``policy``, ``network`` ->
``config`` -> ``models`` and ``errors`` (which import nothing of ours). The SDK (``client``)
stands beside them and imports only ``models`` and ``errors``; ``sandboxd``, the daemon inside
each sandbox, imports nothing of ours. Importing the SDK never imports the server, the store
or a backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ringfence.backends import Executor, create_executor
from ringfence.config import Config
from ringfence.errors import (
    BackendUnavailable,
    DuplicateExecution,
    ExecutionNotFound,
    InvalidRequest,
    RingfenceError,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    UnknownBackend,
)
from ringfence.models import ExecutionRequest, ExecutionResult, Mount, ResourceLimits, Status

if TYPE_CHECKING:
    from ringfence.client import (
        AsyncRingfence,
        AsyncSandbox,
        CommandExitError,
        CommandResult,
        CommandTimeout,
        FileNotFound,
        Ringfence,
        Sandbox,
    )

__version__ = "0.1.0"

# Served from ringfence.client on first use (PEP 562): the SDK costs httpx and ~20 modules.
_SDK_NAMES = frozenset(
    {"AsyncRingfence", "AsyncSandbox", "CommandExitError", "CommandResult", "CommandTimeout",
     "FileNotFound", "Ringfence", "Sandbox"}
)  # fmt: skip

__all__ = [
    "AsyncRingfence",
    "AsyncSandbox",
    "BackendUnavailable",
    "CommandExitError",
    "CommandResult",
    "CommandTimeout",
    "Config",
    "DuplicateExecution",
    "ExecutionNotFound",
    "ExecutionRequest",
    "ExecutionResult",
    "Executor",
    "FileNotFound",
    "InvalidRequest",
    "Mount",
    "ResourceLimits",
    "Ringfence",
    "RingfenceError",
    "Sandbox",
    "SandboxError",
    "SandboxNotFound",
    "SandboxNotRunning",
    "Status",
    "UnknownBackend",
    "__version__",
    "create_executor",
]


if not TYPE_CHECKING:  # mypy reads the imports above, so a misspelt name stays an error

    def __getattr__(name: str) -> object:
        """An SDK name, imported from ``ringfence.client`` the first time it is asked for.

        Raises:
            AttributeError: ``name`` is none of this package's.
        """
        if name not in _SDK_NAMES:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module("ringfence.client"), name)
        globals()[name] = value  # from now on a plain attribute: this hook is not asked again
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SDK_NAMES})
