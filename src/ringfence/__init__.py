"""Ringfence: a self-hosted sandbox runtime for AI agents.

Layers (an import only goes downwards): ``cli`` -> ``backends`` -> ``policy`` ->
``config`` / ``models`` / ``errors``.
"""

from ringfence.backends import Executor, create_executor
from ringfence.config import Config
from ringfence.errors import (
    BackendUnavailable,
    DuplicateExecution,
    ExecutionNotFound,
    InvalidRequest,
    RingfenceError,
    SandboxError,
    UnknownBackend,
)
from ringfence.models import ExecutionRequest, ExecutionResult, Mount, ResourceLimits, Status

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "Config",
    "DuplicateExecution",
    "ExecutionNotFound",
    "ExecutionRequest",
    "ExecutionResult",
    "Executor",
    "InvalidRequest",
    "Mount",
    "ResourceLimits",
    "RingfenceError",
    "SandboxError",
    "Status",
    "UnknownBackend",
    "__version__",
    "create_executor",
]
