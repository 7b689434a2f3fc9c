"""Backends and the factory that picks one by name (``SANDBOX_BACKEND``)."""

from __future__ import annotations

import importlib

from ringfence.backends._interactive import (
    BoundProject,
    BoundVolume,
    Checkpoint,
    LaunchSpec,
    LiveSandbox,
    SandboxRuntime,
    StateSupport,
    Usage,
)
from ringfence.backends._protocol import Executor, OutputCallback, StartCallback
from ringfence.config import Config
from ringfence.errors import UnknownBackend

__all__ = [
    "BACKENDS",
    "BoundProject",
    "BoundVolume",
    "Checkpoint",
    "Executor",
    "LaunchSpec",
    "LiveSandbox",
    "OutputCallback",
    "SandboxRuntime",
    "StartCallback",
    "StateSupport",
    "Usage",
    "create_executor",
    "create_sandbox_runtime",
]

# name -> "module:Class", imported only when chosen.
BACKENDS: dict[str, str] = {
    "job": "ringfence.backends.kubernetes.backend:JobExecutor",
    "local": "ringfence.backends.local:LocalExecutor",
    "process": "ringfence.backends.process:ProcessExecutor",
}


def create_executor(config: Config | None = None) -> Executor:
    """Return the executor that ``config.backend`` names (``local`` unless configured).

    Raises:
        UnknownBackend: the name is not one of ``BACKENDS``.
        BackendUnavailable: the host lacks a prerequisite of that backend.
    """
    config = config or Config()
    try:
        target = BACKENDS[config.backend]
    except KeyError:
        valid = ", ".join(sorted(BACKENDS))
        raise UnknownBackend(
            f"unknown backend {config.backend!r}; valid backends: {valid}"
        ) from None
    module_name, class_name = target.split(":")
    executor: Executor = getattr(importlib.import_module(module_name), class_name)(config)
    return executor


def create_sandbox_runtime(
    executor: Executor, config: Config, *, export_key: bytes | None = None
) -> SandboxRuntime | None:
    """The runtime for interactive sandboxes on ``executor``'s backend; None when that
    backend has none (the process backend: without a sandbox there is nothing to contain
    a long-lived daemon). ``export_key``: the server's key that seals the snapshots its
    sandboxes export and checks them before a restore (None: a key of this process only,
    so nothing exported survives a restart).

    Raises:
        OSError: the runtime directory cannot be prepared.
    """
    from ringfence.backends.local import LocalExecutor

    if executor.name == "job":  # never imports the client unless this backend was chosen
        from ringfence.backends.kubernetes.backend import JobExecutor
        from ringfence.backends.kubernetes.interactive import PodSandboxRuntime

        assert isinstance(executor, JobExecutor)
        return PodSandboxRuntime(config, executor.cluster)
    if isinstance(executor, LocalExecutor):
        from ringfence.backends.local.interactive import LocalSandboxRuntime

        return LocalSandboxRuntime(executor, config, seal_key=export_key)
    return None
