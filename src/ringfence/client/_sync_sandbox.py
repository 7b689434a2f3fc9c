"""``Sandbox``: the blocking twin of ``AsyncSandbox``.

Every method runs its ``AsyncSandbox`` counterpart on the SDK's event loop thread
(``_portal``) and waits: same arguments, same results, same errors, one implementation.
Output callbacks run in that thread. Only the signatures are written twice, and
``tests/client/test_sync_generated.py`` holds them to the async ones: every member present,
same parameters, defaults, annotations and overloads, and each method calling its
counterpart with the arguments it was given.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, overload

from ringfence.client import _portal
from ringfence.client._browser import (
    ActionInput,
    AsyncBrowser,
    CdpEndpoint,
    CookieInput,
    FormatInput,
    RuleInput,
)
from ringfence.client._code import Context, ErrorCallback, Execution, ResultCallback
from ringfence.client._code import OutputCallback as CodeOutputCallback
from ringfence.client._commands import AsyncCommandHandle, AsyncCommands, OutputCallback
from ringfence.client._files import AsyncFiles, AsyncWatchHandle, WriteData, WriteInfo
from ringfence.client._project import AsyncProject, ProjectSource
from ringfence.client._pty import AsyncPty, AsyncPtyHandle, DataCallback
from ringfence.client._sandbox import AsyncSandbox, SandboxInfo
from ringfence.client._types import (
    CommandResult,
    EntryInfo,
    FilesystemEvent,
    OutputChunk,
    ProcessInfo,
)
from ringfence.client._untar import MAX_ARCHIVE_BYTES, MAX_ARCHIVE_ENTRIES
from ringfence.models import (
    CheckpointInfo,
    NetworkPolicy,
    Paused,
    ProjectDiff,
    ProjectSyncReport,
    ResourceLimits,
    SandboxMetrics,
    SandboxState,
    Snapshot,
    VolumeMount,
)
from ringfence.models.browser import BrowserStatus, ScrapeResult

__all__ = [
    "Browser",
    "CommandHandle",
    "Commands",
    "Files",
    "Project",
    "Pty",
    "PtyHandle",
    "Sandbox",
    "WatchHandle",
]

run = _portal.run


class Sandbox:
    """A live sandbox; see ``AsyncSandbox``. ``with Sandbox.create() as sbx:`` kills it on
    exit."""

    def __init__(self, inner: AsyncSandbox) -> None:
        self._inner = inner
        self.commands = Commands(inner.commands)
        self.files = Files(inner.files)
        self.project = Project(inner.project)
        self.pty = Pty(inner.pty)
        self.browser = Browser(inner.browser)

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def sandbox_id(self) -> str:
        return self._inner.id

    def get_url(self, port: int) -> str:
        """See ``AsyncSandbox.get_url``."""
        return self._inner.get_url(port)

    @classmethod
    def create(
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
    ) -> Sandbox:
        """See ``AsyncSandbox.create``."""
        return cls(
            run(
                AsyncSandbox.create(
                    template, timeout=timeout, env=env, metadata=metadata, limits=limits,
                    network=network, snapshot=snapshot, auto_pause=auto_pause,
                    on_timeout=on_timeout, auto_resume=auto_resume, project=project,
                    volumes=volumes, public_traffic=public_traffic, group=group, url=url,
                    api_key=api_key,
                )
            )
        )  # fmt: skip

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        resume: bool = True,
        url: str | None = None,
        api_key: str | None = None,
    ) -> Sandbox:
        """See ``AsyncSandbox.connect``."""
        return cls(run(AsyncSandbox.connect(sandbox_id, resume=resume, url=url, api_key=api_key)))

    @staticmethod
    def list(
        *,
        state: SandboxState | str | Iterable[SandboxState | str] | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 100,
        url: str | None = None,
        api_key: str | None = None,
    ) -> list[SandboxInfo]:
        """See ``AsyncSandbox.list``."""
        return run(
            AsyncSandbox.list(state=state, metadata=metadata, limit=limit, url=url, api_key=api_key)
        )

    def info(self) -> SandboxInfo:
        return run(self._inner.info())

    def is_running(self) -> bool:
        return run(self._inner.is_running())

    def set_timeout(self, timeout: float) -> SandboxInfo:
        return run(self._inner.set_timeout(timeout))

    def metrics(self) -> SandboxMetrics:
        """See ``AsyncSandbox.metrics``."""
        return run(self._inner.metrics())

    def get_network(self) -> NetworkPolicy:
        """See ``AsyncSandbox.get_network``."""
        return run(self._inner.get_network())

    def set_network(self, network: NetworkPolicy | Mapping[str, Any]) -> NetworkPolicy:
        """See ``AsyncSandbox.set_network``."""
        return run(self._inner.set_network(network))

    def pause(self, *, memory: bool = False) -> Paused:
        """See ``AsyncSandbox.pause``."""
        return run(self._inner.pause(memory=memory))

    def resume(self) -> SandboxInfo:
        """See ``AsyncSandbox.resume``."""
        return run(self._inner.resume())

    def checkpoint(self) -> CheckpointInfo:
        """See ``AsyncSandbox.checkpoint``."""
        return run(self._inner.checkpoint())

    def checkpoints(self) -> builtins.list[CheckpointInfo]:
        """See ``AsyncSandbox.checkpoints``."""
        return run(self._inner.checkpoints())

    def rollback(self, checkpoint_id: str) -> None:
        """See ``AsyncSandbox.rollback``."""
        run(self._inner.rollback(checkpoint_id))

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        """See ``AsyncSandbox.delete_checkpoint``."""
        run(self._inner.delete_checkpoint(checkpoint_id))

    def fork(self, count: int = 1) -> builtins.list[Sandbox]:
        """See ``AsyncSandbox.fork``."""
        return [Sandbox(child) for child in run(self._inner.fork(count))]

    def snapshot(self) -> Snapshot:
        """See ``AsyncSandbox.snapshot``."""
        return run(self._inner.snapshot())

    def kill(self) -> SandboxInfo:
        return run(self._inner.kill())

    def run_code(
        self,
        code: str,
        *,
        context: Context | str | None = None,
        language: str | None = None,
        on_stdout: CodeOutputCallback | None = None,
        on_stderr: CodeOutputCallback | None = None,
        on_result: ResultCallback | None = None,
        on_error: ErrorCallback | None = None,
        envs: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Execution:
        """See ``AsyncSandbox.run_code``."""
        return run(
            self._inner.run_code(
                code, context=context, language=language, on_stdout=on_stdout,
                on_stderr=on_stderr, on_result=on_result, on_error=on_error, envs=envs,
                timeout=timeout,
            )
        )  # fmt: skip

    def create_code_context(self, language: str | None = None, cwd: str | None = None) -> Context:
        return run(self._inner.create_code_context(language, cwd))

    def list_code_contexts(self) -> builtins.list[Context]:
        return run(self._inner.list_code_contexts())

    def restart_code_context(self, context: Context | str) -> None:
        run(self._inner.restart_code_context(context))

    def remove_code_context(self, context: Context | str) -> None:
        run(self._inner.remove_code_context(context))

    def close(self) -> None:
        """Release this object's connections; the sandbox keeps running."""
        run(self._inner.aclose())

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        run(self._inner.__aexit__(kind, exc, tb))

    def __repr__(self) -> str:
        return f"<Sandbox {self.id}>"


class Commands:
    """See ``AsyncCommands``."""

    def __init__(self, inner: AsyncCommands) -> None:
        self._inner = inner

    @overload
    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: Literal[False] = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = 60,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        stdin: bool = False,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: Literal[True],
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = 60,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        stdin: bool = False,
    ) -> CommandHandle: ...

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: bool = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = 60,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        stdin: bool = False,
    ) -> CommandResult | CommandHandle:
        """See ``AsyncCommands.run``."""
        options: dict[str, Any] = {
            "envs": envs, "cwd": cwd, "user": user, "timeout": timeout,
            "on_stdout": on_stdout, "on_stderr": on_stderr, "stdin": stdin,
        }  # fmt: skip
        if background:
            return CommandHandle(run(self._inner.run(cmd, background=True, **options)))
        return run(self._inner.run(cmd, background=False, **options))

    def connect(
        self,
        pid: int,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> CommandHandle:
        return CommandHandle(
            run(self._inner.connect(pid, on_stdout=on_stdout, on_stderr=on_stderr))
        )

    def list(self) -> list[ProcessInfo]:
        return run(self._inner.list())

    def kill(self, pid: int) -> bool:
        return run(self._inner.kill(pid))

    def send_stdin(self, pid: int, data: str | bytes) -> None:
        run(self._inner.send_stdin(pid, data))

    def close_stdin(self, pid: int) -> None:
        run(self._inner.close_stdin(pid))


class CommandHandle:
    """See ``AsyncCommandHandle``; iterate it for ``OutputChunk``s."""

    def __init__(self, inner: AsyncCommandHandle) -> None:
        self._inner = inner
        self.pid = inner.pid

    @property
    def stdout(self) -> str:
        return self._inner.stdout

    @property
    def stderr(self) -> str:
        return self._inner.stderr

    def __iter__(self) -> Iterator[OutputChunk]:
        return _portal.iterate(self._inner)

    def wait(self) -> CommandResult:
        return run(self._inner.wait())

    def kill(self) -> bool:
        return run(self._inner.kill())

    def send_stdin(self, data: str | bytes) -> None:
        run(self._inner.send_stdin(data))

    def close_stdin(self) -> None:
        run(self._inner.close_stdin())

    def disconnect(self) -> None:
        run(self._inner.disconnect())


class Project:
    """See ``AsyncProject``."""

    def __init__(self, inner: AsyncProject) -> None:
        self._inner = inner

    def diff(self) -> ProjectDiff:
        return run(self._inner.diff())

    def sync(
        self, paths: Sequence[str] | None = None, *, include_sensitive: bool = False
    ) -> ProjectSyncReport:
        return run(self._inner.sync(paths, include_sensitive=include_sensitive))


class Browser:
    """See ``AsyncBrowser``."""

    def __init__(self, inner: AsyncBrowser) -> None:
        self._inner = inner

    def scrape(
        self,
        url: str | None = None,
        *,
        formats: Sequence[FormatInput] | None = None,
        actions: Iterable[ActionInput] | None = None,
        only_main_content: bool = True,
        wait_for: int = 0,
        timeout: int = 30_000,
        headers: Mapping[str, str] | None = None,
        cookies: Iterable[CookieInput] | None = None,
        firewall: Iterable[RuleInput] | None = None,
    ) -> ScrapeResult:
        return run(
            self._inner.scrape(
                url, formats=formats, actions=actions, only_main_content=only_main_content,
                wait_for=wait_for, timeout=timeout, headers=headers, cookies=cookies,
                firewall=firewall,
            )
        )  # fmt: skip

    def status(self) -> BrowserStatus:
        return run(self._inner.status())

    def close(self) -> BrowserStatus:
        return run(self._inner.close())

    def cdp_url(self) -> CdpEndpoint:
        return self._inner.cdp_url()


class Pty:
    """See ``AsyncPty``; ``on_data`` runs in the SDK's loop thread."""

    def __init__(self, inner: AsyncPty) -> None:
        self._inner = inner

    def create(
        self,
        rows: int = 24,
        cols: int = 80,
        *,
        cmd: Sequence[str] | None = None,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        on_data: DataCallback | None = None,
    ) -> PtyHandle:
        return PtyHandle(
            run(
                self._inner.create(
                    rows, cols, cmd=cmd, envs=envs, cwd=cwd, user=user, timeout=timeout,
                    on_data=on_data,
                )
            )
        )  # fmt: skip

    def connect(self, pid: int, *, on_data: DataCallback | None = None) -> PtyHandle:
        return PtyHandle(run(self._inner.connect(pid, on_data=on_data)))

    def send_input(self, pid: int, data: str | bytes) -> None:
        run(self._inner.send_input(pid, data))

    def resize(self, pid: int, rows: int, cols: int) -> None:
        run(self._inner.resize(pid, rows, cols))

    def kill(self, pid: int) -> bool:
        return run(self._inner.kill(pid))


class PtyHandle:
    """See ``AsyncPtyHandle``; iterate it for ``bytes``."""

    def __init__(self, inner: AsyncPtyHandle) -> None:
        self._inner = inner
        self.pid = inner.pid

    def __iter__(self) -> Iterator[bytes]:
        return _portal.iterate(self._inner)

    def wait(self) -> int:
        return run(self._inner.wait())

    def send_input(self, data: str | bytes) -> None:
        run(self._inner.send_input(data))

    def resize(self, rows: int, cols: int) -> None:
        run(self._inner.resize(rows, cols))

    def kill(self) -> bool:
        return run(self._inner.kill())

    def disconnect(self) -> None:
        run(self._inner.disconnect())


class Files:
    """See ``AsyncFiles``."""

    def __init__(self, inner: AsyncFiles) -> None:
        self._inner = inner

    @overload
    def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    def read(self, path: str, format: Literal["text", "bytes"] = "text") -> str | bytes:
        if format == "bytes":
            return run(self._inner.read(path, "bytes"))
        return run(self._inner.read(path, "text"))

    def read_stream(self, path: str) -> Iterator[bytes]:
        return _portal.iterate(self._inner.read_stream(path))

    def write(self, path: str, data: WriteData) -> WriteInfo:
        return run(self._inner.write(path, data))

    def upload(self, local_path: str | Path, path: str) -> WriteInfo:
        return run(self._inner.upload(local_path, path))

    def download(self, path: str, local_path: str | Path) -> Path:
        return run(self._inner.download(path, local_path))

    def read_archive(self, path: str) -> Iterator[bytes]:
        return _portal.iterate(self._inner.read_archive(path))

    def download_dir(
        self,
        path: str,
        local_dir: str | Path,
        *,
        max_bytes: int = MAX_ARCHIVE_BYTES,
        max_entries: int = MAX_ARCHIVE_ENTRIES,
    ) -> Path:
        return run(
            self._inner.download_dir(path, local_dir, max_bytes=max_bytes, max_entries=max_entries)
        )

    def list(self, path: str, depth: int = 1) -> list[EntryInfo]:
        return run(self._inner.list(path, depth))

    def exists(self, path: str) -> bool:
        return run(self._inner.exists(path))

    def get_info(self, path: str) -> EntryInfo:
        return run(self._inner.get_info(path))

    def make_dir(self, path: str) -> bool:
        return run(self._inner.make_dir(path))

    def remove(self, path: str) -> None:
        run(self._inner.remove(path))

    def rename(self, old_path: str, new_path: str) -> EntryInfo:
        return run(self._inner.rename(old_path, new_path))

    def watch_dir(self, path: str, *, recursive: bool = False) -> WatchHandle:
        return WatchHandle(run(self._inner.watch_dir(path, recursive=recursive)))


class WatchHandle:
    """See ``AsyncWatchHandle``: iterate it (blocks for each event), or poll
    ``get_new_events()``; ``stop()`` when done."""

    def __init__(self, inner: AsyncWatchHandle) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[FilesystemEvent]:
        return _portal.iterate(self._inner)

    def get_new_events(self) -> list[FilesystemEvent]:
        return run(_now(self._inner))

    def stop(self) -> None:
        run(self._inner.stop())


async def _now(handle: AsyncWatchHandle) -> list[FilesystemEvent]:
    return handle.get_new_events()  # on the loop's thread: its queue is not thread-safe
