"""Volumes: a tenant's named, persistent storage, mounted into sandboxes at create and read
and written without one (docs/design.md 14.3).

The service owns what a volume means to a tenant: names unique per tenant (another
tenant's volume is "no such volume"), the quota (a default, the operator's ceiling, a count
per tenant), that a volume is not deleted while a running or paused sandbox mounts it, and
the audit record. The files live on the server's disk (``backends.local.disks``: an ext4
image per volume, its size the quota) and every file call walks the path as hostile
(``backends.local.volume_files``). A sandbox is given its volumes by ``bind`` (the
``LaunchSpec.volumes`` the runtime mounts).

Delete and mount take turns per tenant: a sandbox being created holds its volumes (a lease,
in this process) until its record (running, naming them) is in the store, and a delete
refuses a volume that is leased or named by a running or paused sandbox's record. Only
one server uses a data directory (design.md 10.15), so the leases of this process are all
there are.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Collection, Iterator
from datetime import UTC, datetime
from pathlib import Path

from ringfence.audit.chain import SYSTEM
from ringfence.backends import BoundVolume
from ringfence.backends.local import volume_files
from ringfence.backends.local.disks import VolumeDisks
from ringfence.config import Config
from ringfence.errors import (
    InvalidRequest,
    RingfenceError,
    SandboxError,
    StateUnsupported,
    TooManyRequests,
    VolumeFull,
    VolumeInUse,
    VolumeNotFound,
)
from ringfence.models import (
    VOLUME_ID,
    SandboxState,
    Volume,
    VolumeEntry,
    VolumeMount,
    VolumeSpec,
)
from ringfence.service.audit import AuditLog
from ringfence.store import Store

__all__ = ["BODY_IDLE_SECONDS", "VolumeService"]

_ID = re.compile(VOLUME_ID)
_LIVE = (SandboxState.RUNNING, SandboxState.PAUSED)
BODY_IDLE_SECONDS = 30.0  # an upload that sends nothing this long is dropped
_MAX_SANDBOXES = 100_000  # a tenant's live sandboxes scanned by a delete: more than any budget


class VolumeService:
    """Tenants' volumes. ``disks`` None: this server keeps none (not root, or a backend
    whose sandboxes cannot mount them): every call is refused with why."""

    def __init__(
        self,
        store: Store,
        disks: VolumeDisks | None,
        config: Config,
        audit: AuditLog | None = None,
        missing: str = "",
        body_idle_seconds: float = BODY_IDLE_SECONDS,
    ) -> None:
        """``missing``: why there are no ``disks`` (said in every refusal).
        ``body_idle_seconds``: how long an upload's client may send nothing."""
        self._body_idle_seconds = body_idle_seconds
        self._store = store
        self._disks = disks
        self._config = config
        self._audit = audit
        self._missing = missing or "this server keeps no volumes"
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._leases: Counter[str] = Counter()  # volume id -> sandboxes being started on it
        self._space = asyncio.Lock()  # the disk's room, counted by one create at a time

    @property
    def available(self) -> bool:
        return self._disks is not None

    async def unmount_all(self) -> None:
        """Unmount every volume on the host (the app's shutdown, once its sandboxes are
        gone; a volume is mounted again by its next use). Files stay."""
        if self._disks is not None:
            await asyncio.to_thread(self._disks.close)

    def _on_disk(self) -> VolumeDisks:
        if self._disks is None:
            raise StateUnsupported(f"volumes: {self._missing}")
        return self._disks

    async def create(self, tenant: str, spec: VolumeSpec, *, actor: str = SYSTEM) -> Volume:
        """A new, empty volume of the tenant's.

        Raises:
            InvalidRequest: the quota is above the server's ceiling, or the name looks like
                a volume id.
            VolumeExists: the tenant has a volume of that name.
            TooManyRequests: the tenant keeps ``max_volumes`` already.
            VolumeFull: the tenant's quotas would pass ``volume_tenant_bytes``, or the data
                directory's disk has no room for the quota beside every volume's and the
                server's reserve (``volume_reserve_bytes``).
            StateUnsupported: this server keeps no volumes.
            SandboxError: its filesystem could not be made.
        """
        disks = self._on_disk()
        quota = spec.quota_bytes or self._config.volume_default_bytes
        if quota > self._config.volume_max_bytes:
            raise InvalidRequest(
                f"quota_bytes: at most {self._config.volume_max_bytes} on this server"
            )
        if _ID.fullmatch(spec.name):
            raise InvalidRequest("name: must not look like a volume id ('vo' + 20 hex)")
        volume = Volume(
            id="vo" + secrets.token_hex(10),
            name=spec.name,
            quota_bytes=quota,
            created_at=datetime.now(UTC),
        )
        async with self._locks[tenant]:
            kept = await self._store.list_volumes(tenant, limit=self._config.max_volumes + 1)
            if len(kept) >= self._config.max_volumes:
                raise TooManyRequests(
                    f"you keep {len(kept)} volumes, this server's most: delete one first"
                )
            promised = sum(other.quota_bytes for other in kept) + quota
            budget = self._config.volume_tenant_bytes
            if promised > budget:
                raise VolumeFull(
                    f"your volumes' quotas would add up to {_gib(promised)}, this server's "
                    f"most per tenant is {_gib(budget)}: delete one or ask for less"
                )
            async with self._space:  # one create at a time counts the disk's room
                await self._check_room(disks, quota)
                await asyncio.to_thread(disks.create, volume.id, quota)
            try:
                await self._store.add_volume(tenant, volume)
            except BaseException:
                await asyncio.shield(asyncio.to_thread(disks.delete, volume.id))
                raise
        self._record(tenant, actor, "volume.create", volume, quota_bytes=quota)
        return volume

    async def _check_room(self, disks: VolumeDisks, quota: int) -> None:
        """Refuse a quota the data directory's disk could not hold beside every other
        volume's (images are sparse: what each may still take is promised) and the
        reserve the server keeps for its store, its log, snapshots and paused sandboxes."""
        free, promised = await asyncio.to_thread(disks.room)
        reserve = self._config.volume_reserve_bytes
        if promised + quota + reserve > free:
            raise VolumeFull(
                f"this server has no room for a volume of {_gib(quota)}: its disk has "
                f"{_gib(free)} free, volumes may still take {_gib(promised)} of it and "
                f"{_gib(reserve)} is kept for the server"
            )

    async def list_volumes(self, tenant: str, *, limit: int = 100) -> list[Volume]:
        """The tenant's volumes, newest first (without their use: see ``get``)."""
        return await self._store.list_volumes(tenant, limit=limit)

    async def get(self, tenant: str, ref: str) -> Volume:
        """The volume named (or with the id) ``ref``, with the bytes it uses now.

        Raises:
            VolumeNotFound: the tenant has no such volume.
            StateUnsupported: this server keeps no volumes. ``SandboxError``: its disk failed.
        """
        disks = self._on_disk()
        volume = await self._find(tenant, ref)
        used = await asyncio.to_thread(disks.usage, volume.id)
        return volume.model_copy(update={"used_bytes": used})

    async def delete(self, tenant: str, ref: str, *, actor: str = SYSTEM) -> None:
        """Remove the volume and every file in it.

        Raises:
            VolumeNotFound: the tenant has no such volume.
            VolumeInUse: a running or paused sandbox mounts it, or one is starting on it.
            StateUnsupported: this server keeps no volumes.
        """
        disks = self._on_disk()
        async with self._locks[tenant]:
            volume = await self._find(tenant, ref)
            users = await self._users(tenant, volume)
            if users:
                raise VolumeInUse(
                    f"volume {volume.name!r} is mounted by {', '.join(sorted(users))}: "
                    "kill them first"
                )
            await self._store.delete_volume(tenant, volume.id)
        await asyncio.to_thread(disks.delete, volume.id)
        self._record(tenant, actor, "volume.delete", volume)

    async def _users(self, tenant: str, volume: Volume) -> set[str]:
        """The sandboxes (ids) that mount ``volume`` now, or are starting on it."""
        users = {"a sandbox being created"} if self._leases[volume.id] else set()
        live = await self._store.list_sandboxes(tenant, states=_LIVE, limit=_MAX_SANDBOXES)
        users.update(s.id for s in live if any(m.name == volume.name for m in s.volumes))
        return users

    @contextlib.asynccontextmanager
    async def bound(
        self, tenant: str, mounts: Collection[VolumeMount]
    ) -> AsyncIterator[tuple[BoundVolume, ...]]:
        """The tenant's volumes of ``mounts``, mounted on the host, as the runtime takes
        them; none of them can be deleted until this ends (hold it until the sandbox's
        record, naming them, is in the store).

        Raises:
            InvalidRequest: a mount names no volume of the tenant's (another tenant's
                included), or this server keeps no volumes.
            SandboxError: a volume's disk cannot be mounted.
        """
        if not mounts:
            yield ()
            return
        if self._disks is None:
            raise InvalidRequest(f"volumes: {self._missing}")
        disks = self._disks
        async with self._locks[tenant]:
            volumes = []
            for mount in mounts:
                volume = await self._store.get_volume(tenant, name=mount.name)
                if volume is None:
                    raise InvalidRequest(f"volumes: you have no volume named {mount.name!r}")
                volumes.append(volume)
            for volume in volumes:
                self._leases[volume.id] += 1
        try:
            bound = []
            for volume, mount in zip(volumes, mounts, strict=True):
                source = await asyncio.to_thread(disks.mount, volume.id)
                bound.append(BoundVolume(source, mount.path, mount.read_only))
            yield tuple(bound)
        finally:
            for volume in volumes:
                self._leases[volume.id] -= 1
                if self._leases[volume.id] <= 0:
                    del self._leases[volume.id]

    # Files, without a sandbox. Paths are from the volume's root; see ``volume_files``.

    async def stat(self, tenant: str, ref: str, path: str) -> VolumeEntry:
        """The entry at ``path``. Raises ``VolumeNotFound``, ``NotFound``,
        ``InvalidRequest``."""
        async with self._files(tenant, ref) as root:
            return await asyncio.to_thread(volume_files.entry, root, path)

    async def list_dir(self, tenant: str, ref: str, path: str, depth: int = 1) -> list[VolumeEntry]:
        """What the directory at ``path`` holds, ``depth`` levels down. Raises
        ``VolumeNotFound``, ``NotFound``, ``InvalidRequest``."""
        async with self._files(tenant, ref) as root:
            return await asyncio.to_thread(volume_files.entries, root, path, depth)

    async def read(self, tenant: str, ref: str, path: str) -> AsyncIterator[bytes]:
        """The bytes of the file at ``path``, as they are read (the file is opened before
        this returns, so a missing one raises here). Raises ``VolumeNotFound``,
        ``NotFound``, ``InvalidRequest``."""
        async with self._files(tenant, ref) as root:
            fd = await asyncio.to_thread(volume_files.open_for_reading, root, path)
            return _read_off_the_loop(volume_files.read_chunks(fd))

    async def archive(self, tenant: str, ref: str, path: str) -> AsyncIterator[bytes]:
        """The directory at ``path`` as a tar stream (``volume_files.archive``), checked
        before this returns (a missing one raises here). Raises ``VolumeNotFound``,
        ``NotFound``, ``InvalidRequest``."""
        async with self._files(tenant, ref) as root:
            chunks = volume_files.archive(root, path)
            first = await asyncio.to_thread(next, chunks)  # opens it: refusals raise now
            return _read_off_the_loop(_chained(first, chunks))

    async def write(
        self,
        tenant: str,
        ref: str,
        path: str,
        body: AsyncIterator[bytes],
        *,
        uid: int | None = None,
        gid: int | None = None,
        mode: int | None = None,
        parents: bool = True,
    ) -> VolumeEntry:
        """Write the file at ``path`` whole from ``body`` (parents made unless told not).

        The body is read here, on the loop; a worker thread is given one chunk at a time
        to write, so a slow client holds a thread of the shared pool for no longer than a
        chunk's write (it would otherwise starve every tenant's calls that need one). The
        file replaces the old one only once the body is complete: a full volume, a
        stalled client, a client gone, or a cancel leave the old file as it was.

        Raises:
            VolumeFull: the volume has no room for it (the old file is kept).
            InvalidRequest: the client sent nothing for ``body_idle_seconds``; and as
                ``volume_files.begin_write``.
            VolumeNotFound, NotFound: as ``volume_files.begin_write``.
        """
        async with self._files(tenant, ref) as root:
            upload = await asyncio.to_thread(
                volume_files.begin_write, root, path, uid=uid, gid=gid, mode=mode, parents=parents
            )
            try:  # the body is read here, on the loop: a thread only ever writes a chunk it has
                while (chunk := await self._next_chunk(body)) is not None:
                    await asyncio.to_thread(upload.write, chunk)
                return await asyncio.to_thread(upload.commit)
            except BaseException:  # a full volume, a stalled or vanished client, a cancel
                await asyncio.shield(asyncio.to_thread(upload.abort))
                raise

    async def _next_chunk(self, body: AsyncIterator[bytes]) -> bytes | None:
        """The next chunk of an upload's body, or None at its end.

        Raises:
            InvalidRequest: the client sent nothing for ``body_idle_seconds``.
        """
        idle = self._body_idle_seconds
        try:
            return await asyncio.wait_for(anext(body), idle)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise InvalidRequest(
                f"the upload sent nothing for {idle:g} s: it was dropped (the file is as it was)"
            ) from None

    async def make_dir(
        self, tenant: str, ref: str, path: str, *, uid: int | None = None,
        gid: int | None = None, mode: int | None = None, parents: bool = False,
    ) -> VolumeEntry:  # fmt: skip
        """Make a directory. Raises ``Conflict`` (it exists), ``VolumeNotFound``,
        ``NotFound``, ``InvalidRequest``, ``VolumeFull``."""
        async with self._files(tenant, ref) as root:
            return await asyncio.to_thread(
                volume_files.make_dir, root, path, uid=uid, gid=gid, mode=mode, parents=parents
            )

    async def update(
        self, tenant: str, ref: str, path: str, *, uid: int | None = None,
        gid: int | None = None, mode: int | None = None,
    ) -> VolumeEntry:  # fmt: skip
        """Change an entry's owner or mode. Raises ``VolumeNotFound``, ``NotFound``,
        ``InvalidRequest``."""
        async with self._files(tenant, ref) as root:
            return await asyncio.to_thread(
                volume_files.update, root, path, uid=uid, gid=gid, mode=mode
            )

    async def remove(self, tenant: str, ref: str, path: str) -> None:
        """Remove a file, symlink or directory (with what it holds). Raises
        ``VolumeNotFound``, ``NotFound``, ``InvalidRequest``."""
        async with self._files(tenant, ref) as root:
            await asyncio.to_thread(volume_files.remove, root, path)

    @contextlib.asynccontextmanager
    async def _files(self, tenant: str, ref: str) -> AsyncIterator[Path]:
        """The volume's root on the host, for a file call in this block. A volume deleted
        while the call runs (found, then gone before or while it is used) is
        ``VolumeNotFound``, as it would be a moment later, never what its vanished mount
        made of the call (the image missing: a 500).

        Raises:
            VolumeNotFound: the tenant has no such volume, or it was deleted meanwhile.
            SandboxError: its disk cannot be mounted.
        """
        disks = self._on_disk()
        volume = await self._find(tenant, ref)
        try:
            try:
                root = await asyncio.to_thread(disks.mount, volume.id)
            except SandboxError as exc:
                raise SandboxError(f"volume {volume.name!r}: {exc.message}") from exc
            yield root
        except (RingfenceError, OSError) as exc:
            if await self._store.get_volume(tenant, id=volume.id) is None:
                raise VolumeNotFound(f"you have no volume {ref!r} (deleted meanwhile)") from exc
            raise

    async def _find(self, tenant: str, ref: str) -> Volume:
        if _ID.fullmatch(ref):
            volume = await self._store.get_volume(tenant, id=ref)
        else:
            volume = await self._store.get_volume(tenant, name=ref)
        if volume is None:
            raise VolumeNotFound(f"you have no volume {ref!r}")
        return volume

    def _record(
        self, tenant: str, actor: str, action: str, volume: Volume, **details: object
    ) -> None:
        if self._audit is not None:
            target = f"volume:{volume.id}"
            self._audit.record(
                tenant, actor, action, target, "ok", {"name": volume.name, **details}
            )


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.2f} GiB ({size} bytes)"


def _chained(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    try:
        yield first
        yield from rest
    finally:
        _close(rest)


async def _read_off_the_loop(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Each of ``chunks`` read in a worker thread (a slow disk never blocks the loop)."""
    try:
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            yield chunk
    finally:
        await asyncio.to_thread(_close, chunks)


def _close(chunks: Iterator[bytes]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()
