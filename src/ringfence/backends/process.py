"""The ``process`` backend: a plain subprocess. NO isolation; for development only.

It runs the command as the server's own user, with the server's view of the host. It applies
the deadline, cancel, environment and log bounds; it ignores resource limits and cannot grant
mounts. It is never chosen by default: ``SANDBOX_BACKEND=process`` must name it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Sequence

from ringfence.backends._child import Child
from ringfence.backends._supervisor import Launched, SupervisingExecutor
from ringfence.config import Config
from ringfence.errors import InvalidRequest
from ringfence.models import ExecutionRequest, NetworkMode, ResourceLimits

__all__ = ["ProcessExecutor"]

log = logging.getLogger(__name__)

WARNING = (
    "the 'process' backend runs commands as plain subprocesses with NO isolation: "
    "use it only for development with trusted code"
)


class ProcessExecutor(SupervisingExecutor):
    """Runs each request as a subprocess in its own session and a temporary directory."""

    name = "process"

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        log.warning(WARNING)

    def check(self, request: ExecutionRequest) -> None:
        if request.mounts:
            raise InvalidRequest("the process backend cannot grant mounts (it has no sandbox)")
        if request.network is not None and request.network.mode is NetworkMode.RULES:
            raise InvalidRequest(
                "network: the process backend cannot enforce an egress policy (it has no "
                "sandbox; its commands have the host's network)"
            )
        image = request.image or self.config.default_image
        if image != "host":
            raise InvalidRequest(f"the process backend runs on the host only, not image {image!r}")

    async def _launch(
        self, request: ExecutionRequest, limits: ResourceLimits, pass_fds: Sequence[int]
    ) -> Launched:
        workdir = tempfile.mkdtemp(prefix=f"ringfence-{request.id}-")
        env = {"PATH": os.defpath, "HOME": workdir, **request.env}
        try:
            child = Child.spawn(
                request.argv,
                env=env,
                cwd=request.cwd or workdir,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        except OSError:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        return _Subprocess(child, workdir)


class _Subprocess:
    def __init__(self, child: Child, workdir: str) -> None:
        self.child = child
        self.name = f"pid-{child.pid}"
        self.killed = "its process group was killed (descendants that left it may survive)"
        self._workdir = workdir

    async def kill(self) -> None:
        # The command leads its own process group; this misses descendants that left it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.pid, signal.SIGKILL)

    async def release(self) -> str | None:
        await self.kill()
        shutil.rmtree(self._workdir, ignore_errors=True)
        return None

    def setup_error(self, exit_code: int, head: str) -> str | None:
        return None
