"""``AsyncSandbox``: an interactive sandbox, as E2B's SDK shapes it (the source of truth;
``Sandbox`` in ``_sync_sandbox`` is its blocking twin).

    async with await AsyncSandbox.create() as sbx:
        result = await sbx.commands.run("echo hello")
        await sbx.files.write("data.txt", "1,2,3")

Configured by arguments, else ``RINGFENCE_URL`` and ``RINGFENCE_API_KEY``.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from ringfence.client import _base
from ringfence.client._browser import AsyncBrowser
from ringfence.client._code import (
    AsyncCode,
    Context,
    ErrorCallback,
    Execution,
    OutputCallback,
    ResultCallback,
)
from ringfence.client._commands import AsyncCommands
from ringfence.client._files import AsyncFiles
from ringfence.client._link import Link, http_client
from ringfence.client._project import AsyncProject, ProjectSource, project_mount
from ringfence.client._pty import AsyncPty
from ringfence.errors import InvalidRequest, SandboxNotFound, SandboxNotRunning
from ringfence.models import (
    CheckpointInfo,
    Forked,
    NetworkPolicy,
    Paused,
    ResourceLimits,
    SandboxLimits,
    SandboxMetrics,
    SandboxSpec,
    SandboxState,
    Snapshot,
    VolumeMount,
    problems,
)
from ringfence.models import Sandbox as SandboxInfo

__all__ = ["AsyncSandbox", "SandboxInfo", "list_params", "sandbox_spec"]

_TIMEOUT = 600.0


def sandbox_spec(
    template: str,
    timeout: float | None,
    env: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    limits: ResourceLimits | Mapping[str, Any] | None,
    network: NetworkPolicy | Mapping[str, Any] | None = None,
    **lifecycle: Any,
) -> SandboxSpec:
    """The request for a new sandbox, checked before anything is sent. ``lifecycle``:
    ``snapshot``, ``auto_pause``, ``on_timeout``, ``auto_resume``, ``project``, ``volumes``,
    ``public_traffic``, ``group`` (None: the default).

    Raises:
        InvalidRequest: a field is invalid.
    """
    policy = None if network is None else _base.network_policy(network)
    fields = {name: value for name, value in lifecycle.items() if value is not None}
    if fields.get("snapshot") is None or template != "base":  # base: the snapshot's own
        fields["template"] = template
    try:
        if limits is not None and not isinstance(limits, ResourceLimits):
            limits = SandboxLimits(**limits)
        return SandboxSpec(
            timeout=timeout, env=dict(env or {}), metadata=dict(metadata or {}),
            limits=limits or SandboxLimits(), network=policy, **fields,
        )  # fmt: skip
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidRequest(problems(exc)) from exc


def list_params(
    state: SandboxState | str | Iterable[SandboxState | str] | None,
    metadata: Mapping[str, str] | None,
    limit: int,
) -> list[tuple[str, str | int | float | bool | None]]:
    """The query of a sandbox listing. Raises ``InvalidRequest`` for an unknown state."""
    states = [state] if isinstance(state, str) else list(state or [])
    try:
        params: list[tuple[str, str | int | float | bool | None]] = [
            ("state", SandboxState(s).value) for s in states
        ]
    except ValueError as exc:
        raise InvalidRequest(problems(exc)) from exc
    params += [("metadata", f"{key}={value}") for key, value in (metadata or {}).items()]
    params.append(("limit", limit))
    return params


class AsyncSandbox:
    """A live sandbox: ``commands``, ``files``, ``pty``, ``browser``, and its lifecycle.
    Make one with ``create`` or ``connect``; ``async with`` kills it on exit."""

    def __init__(self, info: SandboxInfo, link: Link) -> None:
        self._link = link
        self._info = info
        self.commands = AsyncCommands(link)
        self.files = AsyncFiles(link)
        self.project = AsyncProject(link)
        self.pty = AsyncPty(link)
        self.browser = AsyncBrowser(link)
        self._code = AsyncCode(link)

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def sandbox_id(self) -> str:
        """The same as ``id`` (E2B's name)."""
        return self._info.id

    def get_url(self, port: int) -> str:
        """The preview URL of ``port``: where a server the sandbox runs on that port (on
        its own loopback) is reached from outside, through the server
        (``/v1/sandboxes/{id}/ports/{port}/``; docs/ports.md). Requests to it need this
        SDK's key (``Authorization: Bearer``) unless the sandbox was created with
        ``public_traffic=True``.

        Raises:
            InvalidRequest: ``port`` is not from 1 to 65535.
        """
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidRequest(f"port must be from 1 to 65535, not {port!r}")
        base = self._link.settings.url.rstrip("/")
        return f"{base}/v1/sandboxes/{quote(self.id, safe='')}/ports/{port}/"

    @classmethod
    async def create(
        cls,
        template: str = "base",
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        limits: ResourceLimits | Mapping[str, Any] | None = None,
        network: NetworkPolicy | Mapping[str, Any] | None = None,
        snapshot: str | None = None,
        auto_pause: float | None = None,
        on_timeout: str = "kill",
        auto_resume: bool = True,
        project: ProjectSource | None = None,
        volumes: Iterable[VolumeMount | Mapping[str, Any]] | None = None,
        public_traffic: bool = False,
        group: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
    ) -> AsyncSandbox:
        """Create a sandbox; returns once it is ready for commands and files.

        ``timeout``: seconds until it is killed (default 300; ``set_timeout`` moves it).
        ``env``: variables of every command. ``limits``: memory, pids, cpus, disk of the
        whole sandbox (``{"memory": "1G"}`` or a ``ResourceLimits``). ``network``: its
        egress policy (``{"rules": [{"domain": "pypi.org"}]}`` or a ``NetworkPolicy``;
        docs/network.md); without it, the tenant's default, else no network at all.
        ``snapshot``: start from that snapshot of yours (its files; its template).
        ``auto_pause``: seconds without a request after which it is paused to disk;
        ``on_timeout="pause"``: its timeout pauses it instead of killing it;
        ``auto_resume=False``: requests to it while paused are refused until ``resume``.
        ``project``: a directory on the server's host (a path, resolved against the current
        directory; or a ``ProjectMount`` to choose where it is shown) shown at
        /home/user/project as a copy-on-write view: ``project.diff`` and ``project.sync``
        read and apply what the sandbox changed; only under the server's project roots.
        ``volumes``: volumes of yours to mount (``[{"name": "data", "path": "/mnt/data"}]``,
        ``"read_only": True`` to keep it unchanged); they outlive the sandbox (``rf.volumes``).
        ``public_traffic=True``: anyone with a preview URL of it (``get_url``) may reach
        its ports, without a key. ``group``: your sandboxes in one group reach each
        other's ports through ``$RINGFENCE_GROUP_PROXY`` inside (docs/ports.md).

        Raises:
            InvalidRequest: bad arguments (a policy too broad, say), no API key, limits above
                the server's ceilings, a policy the server refuses (an internal network).
            SandboxError: it failed to start. Unauthenticated, ServerUnreachable.
        """
        spec = sandbox_spec(
            template, timeout, env, metadata, limits, network, snapshot=snapshot,
            auto_pause=auto_pause, on_timeout=on_timeout, auto_resume=auto_resume,
            project=project_mount(project), volumes=list(volumes) if volumes else None,
            public_traffic=public_traffic or None, group=group,
        )  # fmt: skip
        settings = _base.Settings.resolve(url, api_key, _TIMEOUT)
        http = http_client(settings)
        try:
            try:
                response = await http.post(
                    "/v1/sandboxes", json=spec.model_dump(mode="json", exclude_none=True)
                )
            except httpx.HTTPError as exc:
                raise _base.translate(exc, settings.url) from exc
            info = SandboxInfo.model_validate(_base.checked(response, SandboxNotFound))
        except BaseException:
            await http.aclose()
            raise
        return cls(info, Link(settings, info.id, http))

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        resume: bool = True,
        url: str | None = None,
        api_key: str | None = None,
    ) -> AsyncSandbox:
        """A sandbox created earlier (by this process or another), resumed first if it
        is paused (under the same id; E2B's ``connect`` resumes too), unless ``resume`` is
        False (a handle on it as it is: to kill a paused one, say).

        Raises:
            SandboxNotFound: none with this id in your tenant.
            SandboxNotRunning: it has ended.
            TooManyRequests: no room to resume it now (it stays paused).
        """
        settings = _base.Settings.resolve(url, api_key, _TIMEOUT)
        link = Link(settings, sandbox_id, http_client(settings))
        try:
            info = SandboxInfo.model_validate(
                await link.rest("POST", "/resume") if resume else await link.rest("GET")
            )
            if info.state.is_terminal:
                raise SandboxNotRunning(f"sandbox {sandbox_id} has ended ({info.state.value})")
        except BaseException:
            await link.aclose()
            raise
        return cls(info, link)

    @staticmethod
    async def list(
        *,
        state: SandboxState | str | Iterable[SandboxState | str] | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 100,
        url: str | None = None,
        api_key: str | None = None,
    ) -> list[SandboxInfo]:
        """Your sandboxes, newest first: only those in ``state`` (one or several) and with
        all of ``metadata``, if given.

        Raises:
            InvalidRequest, Unauthenticated, ServerUnreachable.
        """
        params = list_params(state, metadata, limit)
        settings = _base.Settings.resolve(url, api_key, _TIMEOUT)
        async with http_client(settings) as http:
            try:
                response = await http.get("/v1/sandboxes", params=params)
            except httpx.HTTPError as exc:
                raise _base.translate(exc, settings.url) from exc
            return [SandboxInfo.model_validate(s) for s in _base.checked(response)]

    async def info(self) -> SandboxInfo:
        """Its current record: state, metadata, limits, expiry. Raises ``SandboxNotFound``."""
        self._info = SandboxInfo.model_validate(await self._link.rest("GET"))
        return self._info

    async def is_running(self) -> bool:
        return (await self.info()).state is SandboxState.RUNNING

    async def set_timeout(self, timeout: float) -> SandboxInfo:
        """Kill it ``timeout`` seconds from now (sooner or later than before).

        Raises:
            SandboxNotFound, SandboxNotRunning, InvalidRequest (out of range).
        """
        self._info = SandboxInfo.model_validate(
            await self._link.rest("POST", "/timeout", {"timeout": timeout})
        )
        return self._info

    async def metrics(self) -> SandboxMetrics:
        """What it uses now: CPU (time, and percent of its limit over the last moments),
        memory, disk and processes, read from its cgroup and volume. A paused sandbox is
        read as it is (not resumed).

        Raises:
            SandboxNotFound, SandboxNotRunning (ended, or paused to disk).
            BackendUnavailable: the server's backend cannot measure sandboxes.
        """
        return SandboxMetrics.model_validate(await self._link.rest("GET", "/metrics"))

    async def get_network(self) -> NetworkPolicy:
        """The egress policy in force (header values shown as ``<redacted>``).

        Raises:
            SandboxNotFound.
        """
        return NetworkPolicy.model_validate(await self._link.rest("GET", "/network"))

    async def set_network(self, network: NetworkPolicy | Mapping[str, Any]) -> NetworkPolicy:
        """Replace the egress policy: connections opened from now on are decided by it (open
        ones go on; answers given to ``ask`` rules are kept). Returns it as the server keeps
        it (header values redacted).

        Raises:
            InvalidRequest: not a valid policy, one the server refuses, or a sandbox created
                without network (it has no proxy to decide).
            SandboxNotFound, SandboxNotRunning.
        """
        body = _base.network_policy(network).model_dump(mode="json")
        return NetworkPolicy.model_validate(await self._link.rest("PUT", "/network", body))

    async def pause(self, *, memory: bool = False) -> Paused:
        """Pause it; any later request (or ``resume``, or ``connect``) resumes it under the
        same id. ``memory`` True: its processes are stopped where they are, memory held
        (they go on where they were). False: its files are saved and everything else freed
        (its processes start again on resume). Its timeout clock stops while paused. The
        answer says which it was (``memory``).

        Raises:
            StateUnsupported: the server's backend cannot (the message says why).
            SandboxNotFound, SandboxNotRunning.
        """
        paused = Paused.model_validate(await self._link.rest("POST", "/pause", {"memory": memory}))
        self._info = paused.sandbox
        return paused

    async def resume(self) -> SandboxInfo:
        """Resume it if paused (a running one is returned as it is).

        Raises:
            SandboxNotFound, SandboxNotRunning (ended), TooManyRequests (no room now).
        """
        self._info = SandboxInfo.model_validate(await self._link.rest("POST", "/resume"))
        return self._info

    async def checkpoint(self) -> CheckpointInfo:
        """Checkpoint its files (the workspace, /tmp, the root's changes); its processes
        keep running. Returns the checkpoint, whose ``id`` ``rollback`` takes.

        Raises:
            SnapshotBudgetExceeded: its checkpoints are at their budget (delete one).
            StateUnsupported, SandboxNotFound, SandboxNotRunning.
        """
        return CheckpointInfo.model_validate(await self._link.rest("POST", "/checkpoints"))

    async def checkpoints(self) -> builtins.list[CheckpointInfo]:
        """Its checkpoints, oldest first."""
        found = await self._link.rest("GET", "/checkpoints")
        return [CheckpointInfo.model_validate(checkpoint) for checkpoint in found]

    async def rollback(self, checkpoint_id: str) -> None:
        """Restore its files to ``checkpoint_id`` in place: content byte-identical, files
        made since removed, deleted ones back; its processes keep running.

        Raises:
            SandboxNotFound: no such sandbox.
            CheckpointNotFound: no such checkpoint of it (a server before
                ``checkpoint_not_found`` answers ``SandboxNotFound`` here).
        """
        await self._link.rest("POST", "/rollback", {"checkpoint": checkpoint_id})

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Free a checkpoint. Raises ``CheckpointNotFound`` (no such checkpoint of it)."""
        await self._link.rest("DELETE", f"/checkpoints/{quote(checkpoint_id, safe='')}")

    async def fork(self, count: int = 1) -> builtins.list[AsyncSandbox]:
        """Start ``count`` new sandboxes from one checkpoint of its files, each with its own
        id, with its template, limits, metadata, environment and egress policy; their
        processes start fresh. All or none: refused whole when there is no room.

        Raises:
            TooManyRequests: no room for every child now (none was made).
            InvalidRequest: ``count`` out of range. StateUnsupported, SandboxError.
        """
        forked = Forked.model_validate(await self._link.rest("POST", "/fork", {"count": count}))
        settings = self._link.settings
        return [
            AsyncSandbox(child, Link(settings, child.id, http_client(settings)))
            for child in forked.children
        ]

    async def snapshot(self) -> Snapshot:
        """Persist its files as a snapshot of yours: ``create(snapshot=...)`` starts new
        sandboxes from it (``AsyncRingfence.sandboxes`` lists and deletes them).

        Raises:
            SnapshotBudgetExceeded: you keep as many snapshots as you may.
            StateUnsupported, SandboxNotFound, SandboxNotRunning.
        """
        return Snapshot.model_validate(await self._link.rest("POST", "/snapshot"))

    async def kill(self) -> SandboxInfo:
        """Kill it: every process, and everything it wrote. Killing an ended sandbox is no
        error; the answer is its final record. Raises ``SandboxNotFound``."""
        self._info = SandboxInfo.model_validate(await self._link.rest("DELETE"))
        return self._info

    async def run_code(
        self,
        code: str,
        *,
        context: Context | str | None = None,
        language: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_result: ResultCallback | None = None,
        on_error: ErrorCallback | None = None,
        envs: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Execution:
        """Run a cell of code in a persistent context and wait for it to finish.

        Without ``context``, the cell runs in the sandbox's default context of ``language``
        (``"python"`` unless given; ``"bash"`` too). Variables, imports and the working
        directory stay for the next cell of that context. An exception in the cell is not
        raised: it is ``Execution.error``. The callbacks (plain or async functions) get each
        ``OutputMessage``, ``Result`` and ``ExecutionError`` as it arrives. ``envs`` hold for
        this cell only. At ``timeout`` seconds (none by default) the cell is interrupted
        (``KeyboardInterrupt``) and the context kept. Cancelling the call stops reading; the
        cell runs on.

        Raises:
            InvalidRequest: both ``context`` and ``language``, an unknown language.
            ContextNotFound: no such context (removed?).
            SandboxNotRunning: the sandbox has ended (also while the cell ran).
            SandboxError: the answer broke off, or was over its size caps.
            SandboxNotFound, ServerUnreachable.
        """
        return await self._code.run(
            code, context=context, language=language, on_stdout=on_stdout,
            on_stderr=on_stderr, on_result=on_result, on_error=on_error, envs=envs,
            timeout=timeout,
        )  # fmt: skip

    async def create_code_context(
        self, language: str | None = None, cwd: str | None = None
    ) -> Context:
        """A new context (its own interpreter) of ``language`` (default Python), started in
        ``cwd`` (default /home/user).

        Raises:
            InvalidRequest: an unknown language, a ``cwd`` that is not a directory.
            ResourceExhausted: the sandbox has as many contexts as it may.
        """
        return await self._code.create_context(language, cwd)

    async def list_code_contexts(self) -> builtins.list[Context]:
        """The sandbox's code contexts: its default python and (when the template has
        node) javascript ones from the start, as E2B's, and those created."""
        return await self._code.list_contexts()

    async def restart_code_context(self, context: Context | str) -> None:
        """A fresh interpreter for the context: its state is dropped, its id kept.

        Raises:
            ContextNotFound.
        """
        await self._code.restart_context(context)

    async def remove_code_context(self, context: Context | str) -> None:
        """Stop the context's interpreter and forget it.

        Raises:
            ContextNotFound.
        """
        await self._code.remove_context(context)

    async def aclose(self) -> None:
        """Release this object's connections; the sandbox keeps running."""
        await self._link.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.kill()
        finally:
            await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id}>"
