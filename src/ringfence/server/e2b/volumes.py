"""E2B's volumes: the control plane's ``/volumes`` (``X-API-KEY``) and the volume content
API's ``/volumecontent/{id}/...`` (a volume's own token, ``Authorization: Bearer``), over
the native volume service (tenancy, quota, audit and path safety are its).

E2B's ``Volume`` sends content calls to ``E2B_VOLUME_API_URL`` (else ``https://api.<domain>``):
point it at this server as ``E2B_API_URL`` is. A volume's token is derived, not stored (as
sandbox access tokens are: ``tokens``): an HMAC of (tenant, key id, the key's generation,
volume id) under this server process's secret, so it stops working when its key is rotated
or revoked, and at a restart (``Volume.connect`` hands out a fresh one). Another tenant's
volume, or a token minted for another volume, is 404 or 401: nothing of it shows.

A file write makes missing parents and replaces an existing file (``force`` changes
nothing there); a directory's ``force`` makes missing parents, without it a missing parent
is 404 (``VolumePathNotFoundException``) and an existing entry 409. Modes are permission
bits (setuid and setgid are dropped); ids are the ones sandboxes see (0 root, 1000 user).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from ringfence.errors import InvalidRequest, Unauthenticated
from ringfence.models import Volume, VolumeEntry, VolumeSpec
from ringfence.server.connections import authenticated
from ringfence.server.e2b.context import E2bContext, context_of
from ringfence.server.e2b.context import caller as _caller
from ringfence.server.e2b.tokens import Grant, Purpose
from ringfence.service.keys import Principal
from ringfence.service.volumes import VolumeService

__all__ = ["CONTENT_STREAMED", "content_router", "mounts_of", "router"]

router = APIRouter()  # the control plane's
content_router = APIRouter()  # the volume content API's
CONTENT_STREAMED = r"/volumecontent/[^/]+/file"  # uploads stream: the quota bounds them

ApiKey = Annotated[str | None, Header(alias="X-API-KEY")]
VolumeId = Annotated[str, Path(min_length=1, max_length=64)]
EntryPath = Annotated[str, Query(max_length=4096)]
Id = Annotated[int | None, Query(ge=0, le=65535)]
Mode = Annotated[int | None, Query(ge=0, le=0o7777)]


class NewVolume(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str


class MetadataUpdate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    uid: int | None = None
    gid: int | None = None
    mode: int | None = None


def mounts_of(given: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A create's ``volumeMounts`` (``[{name, path}]``, what ``volume_mounts=`` sends) as
    ``SandboxSpec.volumes``; each is checked there (a volume of the tenant's, a path a
    volume may cover)."""
    return [{"name": m.get("name"), "path": m.get("path")} for m in given or []]


def _volumes(context: E2bContext) -> VolumeService:
    return context.sandboxes.volumes


def _with_token(context: E2bContext, caller: Principal, volume: Volume) -> dict[str, Any]:
    grant = Grant(caller.tenant, caller.key_id, caller.generation, volume.id)
    token = context.grants.token_only(grant, Purpose.VOLUME)
    return {"volumeID": volume.id, "name": volume.name, "token": token}


@router.post("/volumes", status_code=201)
async def create(body: NewVolume, request: Request, x_api_key: ApiKey = None) -> dict[str, Any]:
    context, caller = await _caller(request, x_api_key)
    try:
        spec = VolumeSpec(name=body.name)
    except ValidationError as exc:
        raise InvalidRequest(f"name: {exc.errors()[0]['msg']}") from None
    volume = await _volumes(context).create(caller.tenant, spec, actor=caller.key_id)
    return _with_token(context, caller, volume)


@router.get("/volumes")
async def list_volumes(request: Request, x_api_key: ApiKey = None) -> list[dict[str, str]]:
    context, caller = await _caller(request, x_api_key)
    volumes = await _volumes(context).list_volumes(caller.tenant, limit=1000)
    return [{"volumeID": v.id, "name": v.name} for v in volumes]


@router.get("/volumes/{volume_id}")
async def get_info(
    volume_id: VolumeId, request: Request, x_api_key: ApiKey = None
) -> dict[str, Any]:
    context, caller = await _caller(request, x_api_key)
    volume = await _volumes(context).get(caller.tenant, volume_id)
    return _with_token(context, caller, volume)


@router.delete("/volumes/{volume_id}", status_code=204)
async def destroy(volume_id: VolumeId, request: Request, x_api_key: ApiKey = None) -> Response:
    context, caller = await _caller(request, x_api_key)
    await _volumes(context).delete(caller.tenant, volume_id, actor=caller.key_id)
    return Response(status_code=204)


async def _admit(request: Request, volume_id: str) -> tuple[VolumeService, str]:
    """The volume service and the tenant whose token for ``volume_id`` the request bears.

    Raises:
        Unauthenticated: no token, one for another volume, or its key is no longer in force.
    """
    context = context_of(request)
    auth = request.headers.get("authorization", "")
    token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
    grant = context.grants.check(token, volume_id, Purpose.VOLUME)
    if grant is None:
        raise Unauthenticated(f"a valid token for volume {volume_id} is required")
    if not await context.keys.in_force(grant.key_id, grant.generation):
        raise Unauthenticated(
            "the API key this volume token was handed to was revoked or rotated: connect to "
            "the volume again with the key in force"
        )
    authenticated()
    return _volumes(context), grant.tenant


def _shown(entry: VolumeEntry) -> dict[str, Any]:
    return entry.model_dump(mode="json", exclude_none=True)


@content_router.get("/volumecontent/{volume_id}/path")
async def stat(volume_id: VolumeId, path: EntryPath, request: Request) -> dict[str, Any]:
    volumes, tenant = await _admit(request, volume_id)
    return _shown(await volumes.stat(tenant, volume_id, path))


@content_router.get("/volumecontent/{volume_id}/dir")
async def list_dir(
    volume_id: VolumeId,
    path: EntryPath,
    request: Request,
    depth: Annotated[int | None, Query(ge=1, le=16)] = None,
) -> list[dict[str, Any]]:
    volumes, tenant = await _admit(request, volume_id)
    return [_shown(e) for e in await volumes.list_dir(tenant, volume_id, path, depth or 1)]


@content_router.post("/volumecontent/{volume_id}/dir", status_code=201)
async def make_dir(
    volume_id: VolumeId,
    path: EntryPath,
    request: Request,
    uid: Id = None,
    gid: Id = None,
    mode: Mode = None,
    force: bool = False,
) -> dict[str, Any]:
    volumes, tenant = await _admit(request, volume_id)
    made = await volumes.make_dir(
        tenant, volume_id, path, uid=uid, gid=gid, mode=mode, parents=force
    )
    return _shown(made)


@content_router.patch("/volumecontent/{volume_id}/path")
async def update_metadata(
    volume_id: VolumeId,
    path: EntryPath,
    request: Request,
    body: Annotated[MetadataUpdate | None, Body()] = None,
) -> dict[str, Any]:
    volumes, tenant = await _admit(request, volume_id)
    change = body or MetadataUpdate()
    updated = await volumes.update(
        tenant, volume_id, path, uid=change.uid, gid=change.gid, mode=change.mode
    )
    return _shown(updated)


@content_router.delete("/volumecontent/{volume_id}/path", status_code=204)
async def remove(volume_id: VolumeId, path: EntryPath, request: Request) -> Response:
    volumes, tenant = await _admit(request, volume_id)
    await volumes.remove(tenant, volume_id, path)
    return Response(status_code=204)


@content_router.get("/volumecontent/{volume_id}/file")
async def read_file(volume_id: VolumeId, path: EntryPath, request: Request) -> StreamingResponse:
    volumes, tenant = await _admit(request, volume_id)
    chunks = await volumes.read(tenant, volume_id, path)
    return StreamingResponse(chunks, media_type="application/octet-stream")


@content_router.put("/volumecontent/{volume_id}/file", status_code=201)
async def write_file(
    volume_id: VolumeId,
    path: EntryPath,
    request: Request,
    uid: Id = None,
    gid: Id = None,
    mode: Mode = None,
    force: bool = False,
) -> dict[str, Any]:
    volumes, tenant = await _admit(request, volume_id)
    written = await volumes.write(
        tenant, volume_id, path, request.stream(), uid=uid, gid=gid, mode=mode
    )
    return _shown(written)
