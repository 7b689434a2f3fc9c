"""``/v1/volumes``: a tenant's named, persistent volumes, and their files without a sandbox.

A volume is named in a path by its name or its id (``vo`` + hex). Its files are named by
``?path=`` from the volume's root; the semantics are the service's (``service.volumes``):
symlinks are never followed, ``..`` is refused, uploads stream (the quota bounds them) and a
full volume answers 507 (``volume_full``). Mount one into a sandbox with ``volumes`` in the
sandbox's create.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response, StreamingResponse

from ringfence.models import Volume, VolumeEntry, VolumeSpec
from ringfence.server import deps
from ringfence.server.auth import Caller
from ringfence.server.errors import ErrorBody
from ringfence.service.volumes import VolumeService

__all__ = ["STREAMED_PATHS", "router"]

router = APIRouter(prefix="/v1/volumes", tags=["volumes"])

# Uploads pass through as they come: the volume's quota bounds them.
STREAMED_PATHS = re.compile(r"/v1/volumes/[^/]+/files")

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "No such volume in your tenant (volume_not_found)"},
    409: {
        "model": ErrorBody,
        "description": "This server keeps no volumes, the message says why (state_unsupported)",
    },
}
_FILE_ERRORS: dict[int | str, dict[str, object]] = {
    **_ERRORS,
    404: {
        "model": ErrorBody,
        "description": "No such volume in your tenant (volume_not_found), or no such path in "
        "it (not_found)",
    },
}
_FULL: dict[int | str, dict[str, object]] = {
    507: {"model": ErrorBody, "description": "The volume is at its quota (volume_full)"},
}

VolumeRef = Annotated[
    str, Path(min_length=1, max_length=64, description="The volume's name, or its id.")
]
FilePath = Annotated[
    str,
    Query(
        max_length=4096,
        description="Path from the volume's root ('/' is the root); '..' is refused and "
        "symlinks are never followed.",
    ),
]
Uid = Annotated[int | None, Query(ge=0, le=65535, description="Owner, as sandboxes see it.")]
Gid = Annotated[int | None, Query(ge=0, le=65535, description="Group, as sandboxes see it.")]
Mode = Annotated[
    int | None, Query(ge=0, le=0o7777, description="Permission bits (never setuid or setgid).")
]


def _service(request: Request) -> VolumeService:
    return deps.volumes(request)


@router.post(
    "",
    status_code=201,
    response_model=Volume,
    responses={
        **_ERRORS,
        409: {
            "model": ErrorBody,
            "description": "You have a volume of that name (volume_exists), or this server "
            "keeps no volumes (state_unsupported)",
        },
        429: {"model": ErrorBody, "description": "You keep the most volumes allowed"},
    },
    summary="Create a volume",
)
async def create(spec: VolumeSpec, caller: Caller, request: Request) -> Volume:
    return await _service(request).create(caller.tenant, spec, actor=caller.key_id)


@router.get("", response_model=list[Volume], responses=_ERRORS, summary="Your volumes")
async def list_volumes(
    caller: Caller, request: Request, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[Volume]:
    return await _service(request).list_volumes(caller.tenant, limit=limit)


@router.get(
    "/{volume}",
    response_model=Volume,
    responses=_ERRORS,
    summary="A volume, with the bytes it uses",
)
async def get(volume: VolumeRef, caller: Caller, request: Request) -> Volume:
    return await _service(request).get(caller.tenant, volume)


@router.delete(
    "/{volume}",
    status_code=204,
    responses={
        **_ERRORS,
        409: {
            "model": ErrorBody,
            "description": "A running or paused sandbox mounts it (volume_in_use), or this "
            "server keeps no volumes (state_unsupported)",
        },
    },
    summary="Delete a volume and every file in it",
)
async def delete(volume: VolumeRef, caller: Caller, request: Request) -> Response:
    await _service(request).delete(caller.tenant, volume, actor=caller.key_id)
    return Response(status_code=204)


@router.get(
    "/{volume}/files",
    responses={
        **_FILE_ERRORS,
        200: {"description": "The file's bytes", "content": {"application/octet-stream": {}}},
    },
    summary="Download a file from the volume (streamed)",
)
async def read_file(
    volume: VolumeRef, caller: Caller, request: Request, path: FilePath
) -> StreamingResponse:
    chunks = await _service(request).read(caller.tenant, volume, path)
    return StreamingResponse(chunks, media_type="application/octet-stream")


@router.put(
    "/{volume}/files",
    response_model=VolumeEntry,
    responses={**_FILE_ERRORS, **_FULL},
    summary="Upload a file into the volume (streamed; parents are made)",
    openapi_extra={
        "requestBody": {
            "description": "The file's bytes.",
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        }
    },
)
async def write_file(
    volume: VolumeRef,
    caller: Caller,
    request: Request,
    path: FilePath,
    uid: Uid = None,
    gid: Gid = None,
    mode: Mode = None,
) -> VolumeEntry:
    return await _service(request).write(
        caller.tenant, volume, path, request.stream(), uid=uid, gid=gid, mode=mode
    )


@router.get(
    "/{volume}/archive",
    responses={
        **_FILE_ERRORS,
        200: {"description": "A tar stream (POSIX pax)", "content": {"application/x-tar": {}}},
    },
    summary="Download a directory of the volume as a tar archive (streamed)",
)
async def archive(
    volume: VolumeRef, caller: Caller, request: Request, path: FilePath = "/"
) -> StreamingResponse:
    """Entries are named relative to the directory: directories, regular files and
    symlinks (as links); FIFOs, sockets and devices are left out."""
    chunks = await _service(request).archive(caller.tenant, volume, path)
    return StreamingResponse(chunks, media_type="application/x-tar")


@router.delete(
    "/{volume}/files",
    status_code=204,
    responses=_FILE_ERRORS,
    summary="Remove a file, symlink or directory (with what it holds) from the volume",
)
async def remove(volume: VolumeRef, caller: Caller, request: Request, path: FilePath) -> Response:
    await _service(request).remove(caller.tenant, volume, path)
    return Response(status_code=204)


@router.get(
    "/{volume}/stat",
    response_model=VolumeEntry,
    responses=_FILE_ERRORS,
    summary="A file or directory of the volume",
)
async def stat(volume: VolumeRef, caller: Caller, request: Request, path: FilePath) -> VolumeEntry:
    return await _service(request).stat(caller.tenant, volume, path)


@router.get(
    "/{volume}/dir",
    response_model=list[VolumeEntry],
    responses=_FILE_ERRORS,
    summary="What a directory of the volume holds",
)
async def list_dir(
    volume: VolumeRef,
    caller: Caller,
    request: Request,
    path: FilePath = "/",
    depth: Annotated[int, Query(ge=1, le=16, description="Levels down (1: its entries).")] = 1,
) -> list[VolumeEntry]:
    return await _service(request).list_dir(caller.tenant, volume, path, depth)


@router.post(
    "/{volume}/dir",
    status_code=201,
    response_model=VolumeEntry,
    responses={
        **_FILE_ERRORS,
        **_FULL,
        409: {"model": ErrorBody, "description": "Something exists at that path (conflict)"},
    },
    summary="Make a directory in the volume",
)
async def make_dir(
    volume: VolumeRef,
    caller: Caller,
    request: Request,
    path: FilePath,
    parents: Annotated[bool, Query(description="Make missing parents too.")] = False,
    uid: Uid = None,
    gid: Gid = None,
    mode: Mode = None,
) -> VolumeEntry:
    return await _service(request).make_dir(
        caller.tenant, volume, path, uid=uid, gid=gid, mode=mode, parents=parents
    )
