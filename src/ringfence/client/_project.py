"""``AsyncProject``: a sandbox's project view from the SDK (``sbx.project``): what the
sandbox changed in its copy-on-write view of a host directory, and applying chosen changes
back to that directory (docs/design.md 14.7).

    sbx = await AsyncSandbox.create(project="./my-repo")
    ...  # the agent edits /home/user/project
    for change in (await sbx.project.diff()).changes:
        print(change.action, change.path)
    report = await sbx.project.sync(["src/app.py"])
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ringfence.client._link import Link
from ringfence.errors import InvalidRequest
from ringfence.models import (
    ProjectDiff,
    ProjectMount,
    ProjectSyncReport,
    ProjectSyncRequest,
    problems,
)

__all__ = ["AsyncProject", "ProjectSource", "project_mount"]

# A host directory (relative paths are resolved here, on the client), or the mount itself.
ProjectSource = str | os.PathLike[str] | ProjectMount | Mapping[str, Any]


def project_mount(project: ProjectSource | None) -> ProjectMount | None:
    """The ``project`` of a create request; a path is made absolute against the current
    directory (the server resolves symlinks and checks its project roots).

    Raises:
        InvalidRequest: not a valid project.
    """
    if project is None or isinstance(project, ProjectMount):
        return project
    try:
        if isinstance(project, Mapping):
            return ProjectMount.model_validate(dict(project))
        return ProjectMount(source=os.path.abspath(os.fspath(project)))
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(problems(exc)) from exc


class AsyncProject:
    """The project view of one sandbox (``sbx.project``)."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def diff(self) -> ProjectDiff:
        """What the sandbox changed, in path order: each change added, modified or deleted,
        with a unified diff of text files (host first, sandbox second).

        Raises:
            Conflict: the sandbox has no project view. SandboxNotFound, SandboxNotRunning.
        """
        return ProjectDiff.model_validate(await self._link.rest("GET", "/project/diff"))

    async def sync(
        self, paths: Sequence[str] | None = None, *, include_sensitive: bool = False
    ) -> ProjectSyncReport:
        """Apply the sandbox's changes at or below ``paths`` (relative to the project; None:
        every change) to the host directory; what was applied, and what refused and why
        (links out of the project, setuid files, special files, a parent that is a link).
        Paths the host runs (``.git``, ``.envrc``, ...: ``sensitive`` in the diff) are
        applied only with ``include_sensitive=True`` and when a path of ``paths`` names
        them (e.g. ``[".git/hooks/pre-commit"]``).

        Raises:
            InvalidRequest: a path is absolute or has ``..``.
            Conflict: the sandbox has no project view. SandboxNotFound, SandboxNotRunning.
        """
        try:
            request = ProjectSyncRequest(
                paths=None if paths is None else list(paths), include_sensitive=include_sensitive
            )
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(problems(exc)) from exc
        answer = await self._link.rest("POST", "/project/sync", request.model_dump(mode="json"))
        return ProjectSyncReport.model_validate(answer)
