"""A sandbox's project view: which host directories a tenant may name, and the diff and
sync of what the sandbox changed (docs/design.md 14.7).

Who may name what: the server runs as root, so a tenant naming any host path would read
the host through its sandbox. A source is accepted only strictly below one of the roots
the operator gives *that tenant* (``project_roots``, ``RINGFENCE_PROJECT_ROOTS``: tenant ->
roots, "*" for the rest, ``{tenant}`` in a root for the tenant's name; none by default),
after resolving every symlink in it (a link leading out of the roots is refused, as is a
path that is not a directory, a root itself, or one owned by uid 0 unless the operator
allows it: ``allow_root_owned_projects``). The runtime opens the resolved path again one
component at a time without following links, so a component swapped for a link after
this check fails the start.

Diff and sync resolve the sandbox in the caller's tenant (another tenant's is "not found";
a paused one is resumed, as by any request) and read its project layer host-side, through
``ringfence.projects`` (off the event loop, in a small executor of their own:
``PROJECT_WORKERS`` threads, so however many diffs are asked for, asyncio's default
executor, which sandbox starts, checkpoints and volumes use, is never taken; and one diff
or sync at a time per sandbox). Every sync goes on the audit record
(``sandbox.project_sync``: the paths asked for, what was applied and refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

from ringfence import projects
from ringfence.audit.chain import SYSTEM
from ringfence.backends import BoundProject, LaunchSpec, LiveSandbox
from ringfence.config import Config
from ringfence.errors import Conflict, InvalidRequest, SandboxError
from ringfence.models import ProjectDiff, ProjectMount, ProjectSyncReport, SandboxSpec

__all__ = ["SandboxProjects", "bind_project", "check_project", "roots_of"]

_ROOTS_SETTING = "RINGFENCE_PROJECT_ROOTS"
# A tenant's name as a path component of a root ("{tenant}"): never "..", "/" or empty.
_TENANT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
PROJECT_WORKERS = 2  # diffs and syncs running at once, server-wide (the rest wait)
_T = TypeVar("_T")


class Sandboxes(Protocol):
    """What the project operations need of the sandbox service (``SandboxService``)."""

    async def live(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> LiveSandbox: ...

    def launch_of(self, tenant: str, sandbox_id: str) -> LaunchSpec: ...

    def record(
        self,
        tenant: str,
        actor: str,
        action: str,
        sandbox_id: str,
        outcome: str = "ok",
        details: dict[str, object] | None = None,
    ) -> None: ...


def check_project(spec: SandboxSpec, config: Config, tenant: str | None) -> None:
    """Refuse a project the server cannot give this spec (before anything starts).

    Raises:
        InvalidRequest: the backend has no project views, or the spec would be paused to
            disk (an export holds no host directory's view), or ``bind_project`` refuses.
    """
    if spec.project is None:
        return
    if config.backend != "local":
        raise InvalidRequest(
            f"project: the {config.backend} backend has no project views (the local "
            "backend shows a host directory; a Pod has no host directory to show)"
        )
    if spec.auto_pause is not None or spec.on_timeout == "pause":
        raise InvalidRequest(
            "project: a sandbox with a project view cannot be paused to disk (auto_pause, "
            "on_timeout='pause'): its view belongs to a host directory of this server; "
            "pause it keeping memory instead"
        )
    bind_project(spec.project, roots_of(config, tenant), config.allow_root_owned_projects)


def roots_of(config: Config, tenant: str | None) -> list[Path]:
    """The project roots ``tenant`` may name a source under: its own entry of
    ``project_roots``, else the ``"*"`` entry, with ``{tenant}`` in a root standing for the
    tenant (a root naming ``{tenant}`` is left out without one)."""
    roots = config.project_roots
    chosen = roots.get(tenant, roots.get("*", [])) if tenant is not None else roots.get("*", [])
    shown = []
    for root in chosen:
        if "{tenant}" in str(root):
            if tenant is None or not _TENANT_NAME.fullmatch(tenant):
                continue
            root = Path(str(root).replace("{tenant}", tenant))
        shown.append(root)
    return shown


def bind_project(
    project: ProjectMount, roots: Sequence[Path], allow_root_owned: bool = False
) -> BoundProject:
    """The host directory ``project`` names, resolved, as the runtime mounts it.

    Raises:
        InvalidRequest: no roots are configured, the source (its symlinks resolved) is
            under none of them or is a root itself, it is not a directory, or it belongs
            to uid 0 (unless ``allow_root_owned``).
    """
    if not roots:
        raise InvalidRequest(
            f"project: this server lets no host directory be named by this tenant (the "
            f"operator lists the directories projects may come from in {_ROOTS_SETTING})"
        )
    source = os.path.realpath(project.source)
    resolved = [os.path.realpath(root) for root in roots]
    if source in resolved:
        raise InvalidRequest(
            f"project: {project.source} is a project root itself ({_ROOTS_SETTING}): name "
            "a directory below it"
        )
    if not any(_within(source, root) for root in resolved):
        raise InvalidRequest(
            f"project: {project.source} is not under a project root of this tenant "
            f"({_ROOTS_SETTING}; symlinks are resolved first)"
        )
    try:
        owner = projects.owner_of(Path(source))
    except OSError as exc:
        raise InvalidRequest(f"project: {project.source} is not a directory here") from exc
    if owner.uid == 0 and not allow_root_owned:
        raise InvalidRequest(
            f"project: {project.source} belongs to root (uid 0): its view would show root's "
            "files as the sandbox user's and a sync would write as root; name a directory "
            "a user owns (or the operator sets RINGFENCE_ALLOW_ROOT_OWNED_PROJECTS)"
        )
    return BoundProject(source=Path(source), target=project.path)


def _within(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


class SandboxProjects:
    """Diff and sync of running sandboxes' project views."""

    def __init__(self, sandboxes: Sandboxes) -> None:
        self._sandboxes = sandboxes
        # One diff or sync at a time per sandbox: its lock, and how many hold or await it.
        self._busy: dict[str, tuple[asyncio.Lock, int]] = {}
        self._workers = ThreadPoolExecutor(PROJECT_WORKERS, thread_name_prefix="rf-project")

    @contextlib.asynccontextmanager
    async def _turn(self, sandbox_id: str) -> AsyncIterator[None]:
        """Hold the sandbox's project lock: two syncs at once would each meet the other's
        half-applied files, and a tenant's many diffs of one sandbox queue here instead of
        filling the workers."""
        lock, users = self._busy.get(sandbox_id, (asyncio.Lock(), 0))
        self._busy[sandbox_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._busy[sandbox_id]
            if users == 1:
                del self._busy[sandbox_id]
            else:
                self._busy[sandbox_id] = (lock, users - 1)

    async def _run(self, sandbox_id: str, work: Callable[[], _T]) -> _T:
        """``work`` in the project executor, in the sandbox's turn."""
        async with self._turn(sandbox_id):
            return await asyncio.get_running_loop().run_in_executor(self._workers, work)

    async def diff(self, tenant: str, sandbox_id: str, *, actor: str = SYSTEM) -> ProjectDiff:
        """What the sandbox changed in its project view, with diffs of text files.

        Raises:
            SandboxNotFound, SandboxNotRunning: as for any request to a sandbox.
            Conflict: it has no project view.
            SandboxError: its project layer cannot be read.
        """
        upper, bound = await self._layer(tenant, sandbox_id, actor)
        try:
            changes, truncated = await self._run(
                sandbox_id, lambda: projects.diff(upper, bound.source)
            )
        except OSError as exc:
            raise SandboxError(f"the project view cannot be read: {exc.strerror}") from exc
        return ProjectDiff(
            source=str(bound.source), path=bound.target, changes=changes, truncated=truncated
        )

    async def sync(
        self,
        tenant: str,
        sandbox_id: str,
        paths: Sequence[str] | None,
        *,
        include_sensitive: bool = False,
        actor: str = SYSTEM,
    ) -> ProjectSyncReport:
        """Apply the changes at or below ``paths`` (project-relative, checked by
        ``ProjectSyncRequest``; None: all) to the host directory, as its owner; the
        sensitive ones only when ``include_sensitive`` and named (``projects.sync``).

        Raises:
            What ``diff`` raises (nothing was applied then).
        """
        upper, bound = await self._layer(tenant, sandbox_id, actor)
        disk = self._sandboxes.launch_of(tenant, sandbox_id).limits.disk
        max_bytes = disk if disk is not None else projects.DEFAULT_MAX_BYTES
        details: dict[str, object] = {
            "source": str(bound.source),
            "paths": paths,
            "include_sensitive": include_sensitive,
        }
        try:
            applied, refused = await self._run(
                sandbox_id,
                lambda: projects.sync(upper, bound.source, paths, include_sensitive, max_bytes),
            )
        except (OSError, SandboxError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else exc.message
            details["error"] = why
            self._sandboxes.record(
                tenant, actor, "sandbox.project_sync", sandbox_id, "failed", details
            )
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"the project view cannot be read: {why}") from exc
        details["applied"] = [change.path for change in applied]
        details["refused"] = {refusal.path: refusal.reason for refusal in refused}
        self._sandboxes.record(tenant, actor, "sandbox.project_sync", sandbox_id, "ok", details)
        return ProjectSyncReport(source=str(bound.source), applied=applied, refused=refused)

    async def _layer(self, tenant: str, sandbox_id: str, actor: str) -> tuple[Path, BoundProject]:
        live = await self._sandboxes.live(tenant, sandbox_id, actor=actor)
        bound = self._sandboxes.launch_of(tenant, sandbox_id).project
        upper = live.project_layer
        if bound is None or upper is None:
            raise Conflict(f"sandbox {sandbox_id} has no project view (create it with a project)")
        return upper, bound
