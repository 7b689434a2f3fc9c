"""The ``local`` backend: bubblewrap namespaces + seccomp + cgroups, the embedded default.

Start-up of one sandbox:
1. take a host uid of its own from the operator's range (``uids``; two for an interactive
   sandbox, which runs as root inside: ``userns``), and create its cgroup;
2. start bwrap as that unprivileged uid, with the seccomp program on a pipe, told to
   report the sandbox init's pid (``--info-fd``) and to wait (``--block-fd``) before it starts
   the command;
3. move the sandbox init into the cgroup, so every process of the sandbox is inside it;
   root inside: write its two-id map and let bwrap go on (``--userns-block-fd``);
4. with a network policy, attach Ringfence's proxy and resolver to the sandbox's loopback
   (``ringfence.network``): they exist before any code of the request runs;
5. let the command start.
An interactive sandbox (``interactive``) also gets a volume (``volume``: a tmpfs on the host
holding its workspace, /tmp and the upper layers of its writable root), mounted between
steps 1 and 2 and filled from a snapshot first when it is restored. One-shot executions get
none: they keep in-sandbox tmpfs and a read-only root (a volume costs mounts per start, and
nothing of a one-shot is ever captured).

The end: the pid namespace dies with its init; the cgroup is swept and removed; only then,
with no process of the sandbox left, is its volume unmounted, and last its uid goes back to
the range.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import struct
import termios
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ringfence.backends._child import Child
from ringfence.backends._interactive import BoundProject
from ringfence.backends._supervisor import SupervisingExecutor
from ringfence.backends.local._memfd import memfd_with
from ringfence.backends.local.bwrap import LAUNCH_ENV, Fds, bwrap_args, pack_args
from ringfence.backends.local.cgroups import Cgroup
from ringfence.backends.local.probe import Host, require
from ringfence.backends.local.rootfs import HOST_IMAGE, Entry, layout_for, overlaid
from ringfence.backends.local.uids import SandboxUids, drop_privileges
from ringfence.backends.local.userns import HostIds, enter_ids
from ringfence.backends.local.volume import Volume, Volumes
from ringfence.config import Config
from ringfence.errors import InvalidRequest, SandboxError, StateUnsupported
from ringfence.models import ExecutionRequest, NetworkMode, ResourceLimits
from ringfence.network.gateway import LISTENING, Attachment, EgressGateway
from ringfence.network.intercept import Interceptor
from ringfence.network.own import own_endpoints_of
from ringfence.network.resolver import Resolver
from ringfence.network.session import current_requester

__all__ = ["LocalExecutor", "Populate", "SandboxParts", "SharedMount"]

_INFO_TIMEOUT_SECONDS = 10.0

# Fills a fresh volume before the sandbox starts (a restore); raises to refuse the start.
Populate = Callable[[Volume], None]
# A tenant's volume to mount: its host directory, the target inside, read-only or not.
SharedMount = tuple[Path, str, bool]


@dataclasses.dataclass(frozen=True)
class SandboxParts:
    """What the state of one running sandbox is captured through (``interactive``)."""

    cgroup: Cgroup
    init: int  # the sandbox init's host pid: its root is /proc/<init>/root
    volume: Volume | None  # None when the host gives sandboxes none (``state_missing``)


class LocalExecutor(SupervisingExecutor):
    """Runs each request in a fresh bubblewrap sandbox with every isolation layer."""

    name = "local"

    def __init__(
        self, config: Config, host: Host | None = None, egress: EgressGateway | None = None
    ) -> None:
        """Raises ``BackendUnavailable`` when the host lacks an isolation layer.
        ``egress``: the proxy and resolver that sandboxes with a network policy use."""
        super().__init__(config)
        self._host = host or require(config)
        self._host_layout = layout_for(HOST_IMAGE, self._host.files)
        # Not root: every sandbox runs as our own uid, there is none to hand out.
        self._uids = SandboxUids(config) if self._host.setpriv is not None else None
        self._own_interceptor: Interceptor | None = None
        if egress is None:
            if config.network_intercept:
                self._own_interceptor = Interceptor(config.runtime_dir)
            own = own_endpoints_of(config, LISTENING)
            egress = EgressGateway(Resolver(config.network_hosts), self._own_interceptor, own=own)
        self.egress = egress
        # Root with overlays: interactive sandboxes get volumes (else: the reasons why not).
        self._volumes = Volumes(config.runtime_dir) if self._host.volumes else None
        self._reserved: dict[str, Populate | None] = {}  # run id -> interactive, not started
        self._shared: dict[str, tuple[SharedMount, ...]] = {}  # run id -> tenants' volumes
        self._projects: dict[str, BoundProject] = {}  # run id -> its project view, reserved
        self._live: dict[str, _BwrapLaunch] = {}  # run id -> a running interactive sandbox

    @property
    def state_missing(self) -> tuple[str, ...]:
        """Why sandboxes get no volume here (empty: they do)."""
        return self._host.state_missing

    async def aclose(self) -> None:
        await super().aclose()
        if self._own_interceptor is not None:  # its CA dies with it: so does the bundle
            self._own_interceptor.close()
        if self._uids is not None:
            self._uids.close()
        if self._volumes is not None:
            self._volumes.close()

    def reserve(
        self,
        run_id: str,
        populate: Populate | None = None,
        shared: Sequence[SharedMount] = (),
        project: BoundProject | None = None,
    ) -> None:
        """Mark execution ``run_id`` (not started yet) as an interactive sandbox: ``parts``
        will find its cgroup and init, and its volume when the host gives sandboxes one,
        filled by ``populate`` before its command starts, with the tenants' volumes of
        ``shared`` (``(host directory, target, read_only)``) mounted in it (``volume_binds``)
        and ``project``'s view when given. ``unreserve`` once ``execute`` has returned or
        failed.

        Raises:
            StateUnsupported: ``populate`` or ``shared`` given, but this host gives
                sandboxes no volume.
            SandboxError: ``project`` given, but this host gives sandboxes no volume (its
                view's upper layer lives there).
        """
        if self._volumes is None and (populate is not None or shared):
            doing = "restored" if populate is not None else "given volumes"
            raise StateUnsupported(
                f"sandboxes cannot be {doing} here: {'; '.join(self.state_missing)}"
            )
        if project is not None and self._volumes is None:
            raise SandboxError(
                "a project view needs a sandbox volume, which this host gives none: "
                f"{'; '.join(self.state_missing)}"
            )
        self._reserved[run_id] = populate
        self._shared[run_id] = tuple(shared)
        if project is not None:
            self._projects[run_id] = project

    def unreserve(self, run_id: str) -> None:
        self._reserved.pop(run_id, None)
        self._shared.pop(run_id, None)
        self._projects.pop(run_id, None)

    def parts(self, run_id: str) -> SandboxParts | None:
        """The cgroup, init and volume of running execution ``run_id`` (reserved with
        ``reserve``); None once it is no longer running."""
        launched = self._live.get(run_id)
        if launched is None or launched.init is None:
            return None
        return SandboxParts(launched.cgroup, launched.init, launched.volume)

    async def _volume_for(
        self,
        request: ExecutionRequest,
        layout: tuple[Entry, ...],
        limits: ResourceLimits,
        root_uid: int,
        user_uid: int,
    ) -> Volume | None:
        """The volume of a reserved sandbox when this host gives them one (mounted and
        populated), else None. ``root_uid``/``user_uid``: the host uids the sandbox's root
        and user map to (its layers are the root's, its workspace the user's).

        Raises:
            OSError: it cannot be mounted; SandboxError: ``populate`` refused.
        """
        if self._volumes is None or request.id not in self._reserved:
            return None
        populate = self._reserved[request.id]
        assert limits.disk is not None
        size = limits.disk + self.config.checkpoint_bytes
        volume = self._volumes.create(
            f"rf-{request.id}", size, overlaid(layout), root_uid, user_uid,
            shared=self._shared.get(request.id, ()),
        )  # fmt: skip
        try:
            project = self._projects.get(request.id)
            if project is not None:
                self._add_project(volume, project, root_uid, user_uid)
            if populate is not None:  # a whole export: off the event loop
                await asyncio.to_thread(populate, volume)
            _refuse_planted_links(volume)
        except BaseException:
            volume.close()
            raise
        return volume

    def _add_project(
        self, volume: Volume, project: BoundProject, root_uid: int, user_uid: int
    ) -> None:
        assert self._volumes is not None
        try:
            self._volumes.add_project(volume, project.source, project.target, root_uid, user_uid)
        except OSError as exc:
            raise SandboxError(
                f"cannot show the project directory {project.source}: {exc.strerror or exc}"
            ) from exc

    @property
    def can_run_root_inside(self) -> bool:
        """Whether reserved (interactive) sandboxes run as root inside: we are host root
        (an unprivileged server can map only its own uid)."""
        return self._uids is not None

    def _root_inside(self, request: ExecutionRequest) -> bool:
        return self.can_run_root_inside and request.id in self._reserved

    def check(self, request: ExecutionRequest) -> None:
        """Also raises ``SandboxUidsExhausted`` when the sandbox uids it needs are in use."""
        if self._uids is not None:
            self._uids.check_free(2 if self._root_inside(request) else 1)
        self._layout(request)
        for mount in request.mounts:
            if not os.path.exists(mount.source):
                raise InvalidRequest(f"mount source {mount.source} does not exist on the host")

    def _layout(self, request: ExecutionRequest) -> tuple[Entry, ...]:
        image = request.image or self.config.default_image
        if image == HOST_IMAGE:
            return self._host_layout
        return layout_for(image, self._host.files)

    async def _launch(
        self, request: ExecutionRequest, limits: ResourceLimits, pass_fds: Sequence[int]
    ) -> _BwrapLaunch:
        layout = self._layout(request)  # may refuse: before anything is created
        name = f"rf-{request.id}"
        root_inside = self._root_inside(request)
        with contextlib.ExitStack() as undo, contextlib.ExitStack() as after_spawn:
            uids, give_back = self._take_uids(2 if root_inside else 1)
            undo.callback(give_back)
            uid = uids[0]  # bwrap's: the one-shot's only uid, or the ns root's
            ids = HostIds(*uids) if root_inside else HostIds(root=uid, user=uid)
            cgroup = self._host.cgroups.create(name, limits)
            undo.callback(cgroup.remove)
            volume = await self._volume_for(
                request, layout, limits, root_uid=ids.root, user_uid=ids.user
            )
            if volume is not None:
                undo.callback(volume.close)
            seccomp = memfd_with("seccomp", self._host.seccomp)
            after_spawn.callback(os.close, seccomp)
            info_r, info_w = os.pipe()
            undo.callback(_close, info_r)
            after_spawn.callback(os.close, info_w)  # closed at once: EOF tells bwrap died
            gate_r, gate_w = os.pipe()
            undo.callback(os.close, gate_r)
            gate = _Gate(gate_w)
            undo.callback(gate.close)
            # Root inside: bwrap's child waits on userns_r until we have mapped its ids.
            userns_r: int | None = None
            userns_gate: _Gate | None = None
            if root_inside:
                userns_r, userns_w = os.pipe()
                after_spawn.callback(os.close, userns_r)
                userns_gate = _Gate(userns_w)
                undo.callback(userns_gate.close)
            fds = Fds(seccomp=seccomp, info=info_w, block=gate_r, userns_block=userns_r)
            bundle = self._trust_bundle(request)
            # bwrap reads its isolation options from a memfd (--args); the launcher's own
            # argv only drops privileges, names that fd, and ends with the command.
            isolation_options = bwrap_args(
                layout,
                request,
                limits,
                fds,
                trust_bundle=bundle,
                writable=volume.writable() if volume else None,
            )
            options_fd = memfd_with("bwrap-args", pack_args(isolation_options))
            after_spawn.callback(os.close, options_fd)
            launcher_argv = [
                *drop_privileges(self._host.setpriv, uid),
                self._host.bwrap,
                "--args",
                str(options_fd),
            ]
            child = Child.spawn(
                [*launcher_argv, "--", *request.argv],
                env=LAUNCH_ENV,
                pass_fds=(options_fd, seccomp, info_w, gate_r, *_given(userns_r), *pass_fds),
            )
            after_spawn.close()
            undo.pop_all()  # from here on the sandbox owns its uid, cgroup, gate_r and child
        launched = _BwrapLaunch(child, name, cgroup, gate_r, give_back, volume)
        if request.id in self._reserved:
            self._live[request.id] = launched
            launched.on_release = lambda: self._live.pop(request.id, None)
        entering = asyncio.ensure_future(_enter(info_r, cgroup))
        try:
            try:
                init = await asyncio.shield(entering)
            except asyncio.CancelledError:
                # Until bwrap's init is in its cgroup, the abort's kill would miss it, and
                # the gate closing unopened lets it start the command: outside the cgroup,
                # with nothing of ours left to kill it. So it gets there first (bounded by
                # the info timeout); the abort below then kills it.
                with contextlib.suppress(Exception):
                    await entering
                raise
            # No init: bwrap failed while setting up (its output says why) and nothing of
            # the command ever ran.
            launched.init = init
            if init is not None:
                if userns_gate is not None:
                    await self._map_ids(init, ids, userns_gate)
                launched.egress = await self._attach_egress(request, init)
                launched.open_gate(gate.fd)
        except BaseException:
            await launched.abort()
            raise
        finally:
            gate.close()
            if userns_gate is not None:
                userns_gate.close()
        return launched

    async def _map_ids(self, init: int, ids: HostIds, userns_gate: _Gate) -> None:
        """Map the waiting sandbox's two ids, then let bwrap go on. Raises ``SandboxError``
        (the caller kills the sandbox: its init is in the cgroup already)."""
        assert self._host.nsenter is not None, "the probe finds nsenter when we are root"
        await enter_ids(init, ids, self._host.nsenter)
        os.write(userns_gate.fd, b"1")

    def _take_uids(self, count: int) -> tuple[tuple[int, ...], Callable[[], None]]:
        """``count`` host uids for one sandbox and what gives them all back (our own uid,
        once, when we are not root).

        Raises:
            SandboxUidsExhausted: the range has fewer than ``count`` uids left.
        """
        uids = self._uids
        if uids is None:
            return (os.geteuid(),), lambda: None
        taken = uids.acquire_many(count)

        def give_back() -> None:
            for uid in taken:
                uids.release(uid)

        return taken, give_back

    def _trust_bundle(self, request: ExecutionRequest) -> str | None:
        """The bundle with the egress CA, for a sandbox with a policy when the proxy
        intercepts TLS and the root has a bundle to show it over (else None)."""
        interceptor = self.egress.interceptor
        if interceptor is None or request.network is None:
            return None
        if request.network.mode is NetworkMode.NONE:
            return None
        image = request.image or self.config.default_image
        etc = self._host.files.host_etc if image == HOST_IMAGE else Path(image, "etc")
        if not (etc / "ssl/certs/ca-certificates.crt").is_file():
            return None
        return str(interceptor.bundle)

    async def _attach_egress(self, request: ExecutionRequest, pid: int) -> Attachment | None:
        """Ringfence's proxy and resolver on the sandbox's loopback, if its policy allows
        any network; a failure fails the start (never a sandbox without its policy)."""
        if request.network is None or request.network.mode is NetworkMode.NONE:
            return None
        requester = current_requester()
        if not requester.subject:
            requester = dataclasses.replace(requester, subject=f"execution:{request.id}")
        try:
            return await self.egress.attach(pid, requester, request.network)
        except OSError as exc:
            raise SandboxError(f"cannot attach the egress proxy: {exc}") from exc


class _Gate:
    """The write end of bwrap's gate, closed exactly once."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            os.close(self.fd)


def _given(fd: int | None) -> tuple[int, ...]:
    return () if fd is None else (fd,)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):  # _read_json may have closed it already
        os.close(fd)


class _BwrapLaunch:
    """One command launched in bwrap, in its own cgroup and host uid (this backend's
    ``Launched``): what kills it, what tells whether its command started, what cleans up."""

    killed = "the whole process tree was killed"

    def __init__(
        self,
        child: Child,
        name: str,
        cgroup: Cgroup,
        gate: int,
        give_back_uid: Callable[[], None],
        volume: Volume | None = None,
    ) -> None:
        self.child = child
        self.name = name
        self.cgroup = cgroup
        self.volume = volume  # unmounted after the cgroup is gone, before the uid goes back
        self.init: int | None = None  # the sandbox init's pid, once it is in its cgroup
        self.on_release: Callable[[], object] | None = None
        self._give_back_uid: Callable[[], None] | None = give_back_uid
        # bwrap reads one byte from the gate (--block-fd) after setting the sandbox up and
        # just before it starts the command. We keep the gate's read end: a byte still
        # unread at the end means the command never started, which the command cannot fake.
        self._gate: int | None = gate
        self._opened = False
        self._command_started = False
        self.egress: Attachment | None = None

    async def abort(self) -> None:
        """Undo a start that failed half-way: every step runs even if one before it fails."""
        with contextlib.suppress(SandboxError):
            await self.kill()
        self.child.kill()
        await self.child.wait()
        await self.release()
        self.child.close()

    def open_gate(self, gate_w: int) -> None:
        os.write(gate_w, b"1")
        self._opened = True

    async def kill(self) -> None:
        # The sandbox init is in the cgroup: once it dies the kernel kills its pid namespace.
        self.cgroup.kill_all()
        self.child.kill()

    async def release(self) -> str | None:
        # Blocks the loop briefly (cgroup writes wait on kernel locks); a worker thread per
        # call measured slower on this path (four thread hops per sandbox).
        if self.egress is not None:
            await self.egress.aclose()
            self.egress = None
        if self._gate is not None:
            unread = struct.unpack("i", fcntl.ioctl(self._gate, termios.FIONREAD, b"\0" * 4))[0]
            self._command_started = self._opened and unread == 0
            os.close(self._gate)
            self._gate = None
        if self.on_release is not None:
            self.on_release()
            self.on_release = None
        oom_kills = self.cgroup.oom_kills()
        try:
            self.cgroup.remove()
        except SandboxError as exc:  # a process may be left: its uid stays taken
            return f"cleanup failed: {exc.message}"
        if self.volume is not None:
            try:
                self.volume.close()
            except OSError as exc:  # its files stay owned by the uid: so does the uid
                return f"cleanup failed: cannot unmount the sandbox's volume: {exc}"
            self.volume = None
        # The cgroup is gone, so is every process in it; setpriv and bwrap's monitor run as
        # the uid outside it, so the uid goes back only once they are reaped too (else it
        # stays taken for this server's life: fail closed, never shared).
        if self._give_back_uid is not None and self.child.returncode is not None:
            self._give_back_uid()
            self._give_back_uid = None
        return "out of memory" if oom_kills else None

    def setup_error(self, exit_code: int, head: str) -> str | None:
        if self._command_started:
            return None  # from here on, bwrap's messages and the command's look alike
        lines = head.splitlines()
        reason = lines[0].removeprefix("bwrap: ") if lines else f"bwrap exited with {exit_code}"
        return f"sandbox setup failed: {reason}"


async def _enter(info: int, cgroup: Cgroup) -> int | None:
    """Read bwrap's info from ``info`` (closed here) and move its init into ``cgroup``;
    return the init's pid, or None when bwrap died first (no info, or an init gone before
    it could be moved).

    Raises:
        SandboxError: no info within the timeout, or the kernel refused the move.
    """
    found = await _read_json(info, _INFO_TIMEOUT_SECONDS)
    if found is None:
        return None
    init = int(found["child-pid"])
    return init if cgroup.add(init) else None


async def _read_json(fd: int, timeout: float) -> dict[str, Any] | None:
    """Read one JSON object from ``fd`` without blocking the loop; None at EOF. Closes fd."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[dict[str, Any] | None] = loop.create_future()
    buffer = bytearray()

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        if done.done():
            return
        if not chunk:
            done.set_result(None)
            return
        buffer.extend(chunk)
        with contextlib.suppress(ValueError):  # incomplete: wait for more
            done.set_result(json.loads(buffer))

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        return await asyncio.wait_for(done, timeout)
    except TimeoutError:
        raise SandboxError(f"the sandbox did not start within {timeout:g} s") from None
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _refuse_planted_links(volume: Volume) -> None:
    """Refuse a sandbox whose restored files hold a symlink on the way to one of its
    volumes' or its project's targets (``Volume.planted_link``), before bwrap follows it.

    Raises:
        InvalidRequest: one does (the caller's snapshot or parent planted it).
    """
    targets = [bind.target for bind in volume.shared]
    if volume.project is not None:
        targets.append(volume.project.target)
    for target in targets:
        link = volume.planted_link(target)
        if link is not None:
            raise InvalidRequest(
                f"{link} is a symlink in the sandbox's restored files: nothing is mounted "
                f"at {target} through it (remove it, snapshot again, or mount elsewhere)"
            )
