"""A sandbox's project view on the native API: the diff of what it changed, and the sync
of chosen changes to the host directory (``/v1/sandboxes/{id}/project/...``). The
semantics are the service's (``service.sandbox_projects``); docs/design.md 14.7 says why
they are safe."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from ringfence.errors import Forbidden
from ringfence.models import ProjectDiff, ProjectSyncReport, ProjectSyncRequest, Role
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody

__all__ = ["router"]

router = APIRouter(prefix="/v1/sandboxes", tags=["sandbox projects"])

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request (a path outside the project)"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    403: {
        "model": ErrorBody,
        "description": "A sync asked with an agent key (approver and admin keys may sync)",
    },
    404: {"model": ErrorBody, "description": "No such sandbox in your tenant"},
    409: {
        "model": ErrorBody,
        "description": "The sandbox has ended, or is paused and was created with auto_resume "
        "off (sandbox_not_running); or it has no project view (conflict)",
    },
    421: {
        "model": ErrorBody,
        "description": "Another server replica runs the sandbox (sandbox_on_another_replica)",
    },
    500: {
        "model": ErrorBody,
        "description": "Its project layer cannot be read, or passes the server's caps (too "
        "many entries, too deep, too long a path: sandbox_error); nothing was applied",
    },
}

SandboxId = Annotated[str, Path(max_length=64, description="The sandbox's id.")]


@router.get(
    "/{sandbox_id}/project/diff",
    response_model=ProjectDiff,
    responses=_ERRORS,
    summary="What the sandbox changed in its project view (added, modified, deleted)",
)
async def project_diff(sandbox_id: SandboxId, caller: Caller, request: Request) -> ProjectDiff:
    """Each change, in path order, with a unified diff for text files (host first); the
    host directory is read, never changed."""
    projects = deps.sandboxes(request).projects
    return await projects.diff(caller.tenant, sandbox_id, actor=caller.key_id)


@router.post(
    "/{sandbox_id}/project/sync",
    response_model=ProjectSyncReport,
    responses=_ERRORS,
    summary="Apply the sandbox's changes (all, or the chosen paths) to the host directory",
)
async def project_sync(
    sandbox_id: SandboxId,
    caller: Caller,
    request: Request,
    body: ProjectSyncRequest | None = None,
) -> ProjectSyncReport:
    """Written as the directory's owner, each file atomically; never through a link, never
    outside the directory; devices, fifos, sockets, setuid or setgid files and links that
    leave the project are refused (the report says which, and why). So are paths the
    host runs or trusts (.git, .envrc, editor and shell configuration: flagged sensitive
    in the diff) unless include_sensitive is set and a path names them. Audited.

    Only approver and admin keys: an agent reads its own diff, but a person applies it
    to the host (the agent's key cannot write outside its sandbox by itself)."""
    projects = deps.sandboxes(request).projects
    if caller.role is Role.AGENT:
        await deps.sandboxes(request).get(caller.tenant, sandbox_id)  # another's: 404 first
        raise Forbidden(
            "agent keys cannot apply a sandbox's changes to the host directory (approver "
            "or admin keys can: a person reviews the diff first)"
        )
    body = body or ProjectSyncRequest()
    return await projects.sync(
        caller.tenant,
        sandbox_id,
        body.paths,
        include_sensitive=body.include_sensitive,
        actor=caller.key_id,
    )
