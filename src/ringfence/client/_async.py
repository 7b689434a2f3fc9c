"""``AsyncRingfence``: one-shot executions, proposals, sandboxes by id and their snapshots,
volumes, one-shot scrapes of web pages, over asyncio.

The source of truth: ``scripts/unasync.py`` writes the blocking twin (``_sync.py``,
``Ringfence``) from this file. Edit here, then run it; the tests run it with ``--check``.
Both are thin I/O shells over the pure helpers of ``_base`` and ``_proposals``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from ringfence.client import _base, _browser, _proposals
from ringfence.client._browser import ActionInput, CookieInput, FormatInput, RuleInput
from ringfence.client._proposals import StateFilter
from ringfence.errors import CheckpointNotFound, InvalidRequest, VolumeNotFound
from ringfence.models import (
    ExecutionRequest,
    ExecutionResult,
    Proposal,
    Risk,
    Snapshot,
    Status,
    Volume,
    VolumeEntry,
    VolumeSpec,
    problems,
)
from ringfence.models.browser import ScrapeResult

if TYPE_CHECKING:
    from ringfence.client import AsyncSandbox

__all__ = [
    "AsyncExecutions",
    "AsyncOneShotBrowser",
    "AsyncProposals",
    "AsyncRingfence",
    "AsyncSandboxes",
    "AsyncVolumes",
]


class AsyncRingfence:
    """A connection to a Ringfence server.

    ``url`` and ``api_key`` default to ``RINGFENCE_URL`` (else http://127.0.0.1:8080) and
    ``RINGFENCE_API_KEY``. Use it as ``async with AsyncRingfence() as rf: ...`` or call
    ``aclose()``.

    Raises:
        InvalidRequest: no API key was given either way.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._settings = _base.Settings.resolve(url, api_key, timeout)
        self._http = httpx.AsyncClient(
            base_url=self._settings.url, headers=self._settings.headers(),
            timeout=timeout, transport=transport, verify=_base.tls_context(),
        )  # fmt: skip
        self.executions = AsyncExecutions(self)
        self.proposals = AsyncProposals(self)
        self.sandboxes = AsyncSandboxes(self)
        self.volumes = AsyncVolumes(self)
        self.browser = AsyncOneShotBrowser(self)

    async def _send(self, call: _base.Call) -> httpx.Response:
        try:
            return await self._http.request(
                call.method, call.path, params=call.params, json=call.json,
                content=call.content, timeout=_base.timeout_of(call),
            )  # fmt: skip
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self._settings.url) from exc

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRingfence:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class AsyncExecutions:
    """One-shot executions: each command runs once in a fresh sandbox."""

    def __init__(self, client: AsyncRingfence) -> None:
        self._client = client

    async def run(
        self, command: Sequence[str] | ExecutionRequest, *, wait: bool = True, **fields: Any
    ) -> ExecutionResult:
        """Run ``command`` (a list, or a whole ``ExecutionRequest``); keyword arguments are
        its other fields (``timeout=``, ``env=``, ``limits=``, ``id=``, ``network=``...).
        ``network``: the egress policy (``{"rules": [{"domain": "pypi.org"}]}`` or a
        ``NetworkPolicy``); without it, the tenant's default, else no network. With
        ``wait=False`` it returns at once with status ``pending``.

        Raises:
            InvalidRequest (a bad field or policy, checked before sending), DuplicateExecution,
            Unauthenticated, ServerUnreachable.
        """
        request = _base.build_request(command, fields)
        response = await self._client._send(_base.submit_call(request, wait))
        return _base.read_result(response)

    async def get(self, execution_id: str) -> ExecutionResult:
        """Raises ``ExecutionNotFound``."""
        return _base.read_result(await self._client._send(_base.get_call(execution_id)))

    async def cancel(self, execution_id: str) -> ExecutionResult:
        """Kill its whole process tree. Raises ``ExecutionNotFound``."""
        return _base.read_result(await self._client._send(_base.cancel_call(execution_id)))

    async def list(
        self, *, status: Status | None = None, limit: int = 100
    ) -> list[ExecutionResult]:
        """Your executions, newest first."""
        return _base.read_results(await self._client._send(_base.list_call(status, limit)))


class AsyncSandboxes:
    """Interactive sandboxes by id, and the snapshots of their files (docs/state.md)."""

    def __init__(self, client: AsyncRingfence) -> None:
        self._client = client

    async def connect(self, sandbox_id: str) -> AsyncSandbox:
        """A sandbox of yours, resumed first if it is paused (under the same id).

        Raises:
            SandboxNotFound: none with this id in your tenant.
            SandboxNotRunning: it has ended.
        """
        from ringfence.client import AsyncSandbox  # here: that module imports this package

        settings = self._client._settings
        return await AsyncSandbox.connect(sandbox_id, url=settings.url, api_key=settings.api_key)

    async def list_snapshots(self, *, limit: int = 100) -> list[Snapshot]:
        """Your snapshots, newest first."""
        response = await self._client._send(_base.snapshot_call("GET", limit=limit))
        return [Snapshot.model_validate(s) for s in _base.checked(response, CheckpointNotFound)]

    async def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """Raises ``CheckpointNotFound`` (also for another tenant's)."""
        response = await self._client._send(_base.snapshot_call("GET", snapshot_id))
        return Snapshot.model_validate(_base.checked(response, CheckpointNotFound))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot (sandboxes started from it keep their files). Raises
        ``CheckpointNotFound``."""
        response = await self._client._send(_base.snapshot_call("DELETE", snapshot_id))
        _base.checked(response, CheckpointNotFound)


_Entries = list[VolumeEntry]  # (inside AsyncVolumes, ``list`` is its method)


class AsyncVolumes:
    """Your volumes: named, persistent storage with a quota, mounted into sandboxes at
    create (``AsyncSandbox.create(volumes=...)``), read and written here without one. A
    volume is named by its name or its id; paths are from its root."""

    def __init__(self, client: AsyncRingfence) -> None:
        self._client = client

    async def create(self, name: str, *, quota_bytes: int | None = None) -> Volume:
        """A new, empty volume (``quota_bytes``: default the server's).

        Raises:
            InvalidRequest: a bad name, or a quota above the server's ceiling.
            VolumeExists: you have a volume of that name. TooManyRequests: you keep as many
                as allowed. StateUnsupported: the server keeps no volumes.
        """
        try:
            spec = VolumeSpec(name=name, quota_bytes=quota_bytes)
        except ValueError as exc:
            raise InvalidRequest(problems(exc)) from exc
        body = spec.model_dump(exclude_none=True)
        response = await self._client._send(_base.volume_call("POST", json=body))
        return Volume.model_validate(_base.checked(response, VolumeNotFound))

    async def list(self, *, limit: int = 100) -> list[Volume]:
        """Your volumes, newest first."""
        response = await self._client._send(_base.volume_call("GET", limit=limit))
        return [Volume.model_validate(v) for v in _base.checked(response, VolumeNotFound)]

    async def get(self, volume: str) -> Volume:
        """The volume, with the bytes it uses now. Raises ``VolumeNotFound``."""
        response = await self._client._send(_base.volume_call("GET", volume))
        return Volume.model_validate(_base.checked(response, VolumeNotFound))

    async def delete(self, volume: str) -> None:
        """Delete it and every file in it. Raises ``VolumeNotFound``, ``VolumeInUse`` (a
        running or paused sandbox mounts it)."""
        response = await self._client._send(_base.volume_call("DELETE", volume))
        _base.checked(response, VolumeNotFound)

    async def write_file(self, volume: str, path: str, data: bytes | str) -> VolumeEntry:
        """Write a file whole (its parents made; owned by the sandbox user).

        Raises:
            VolumeFull: it does not fit in the volume's quota. VolumeNotFound.
            InvalidRequest: a path through a symlink, with '..', or naming a directory.
        """
        content = data.encode() if isinstance(data, str) else data
        call = _base.volume_call("PUT", volume, "files", content=content, path=path)
        response = await self._client._send(call)
        return VolumeEntry.model_validate(_base.checked(response, VolumeNotFound))

    async def read_file(self, volume: str, path: str) -> bytes:
        """A file's bytes. Raises ``NotFound`` (no such file), ``VolumeNotFound``."""
        response = await self._client._send(_base.volume_call("GET", volume, "files", path=path))
        if response.is_success:
            return response.content
        _base.checked(response)
        raise AssertionError("unreachable: a failure raises")

    async def download_archive(self, volume: str, path: str, target: str | Path) -> int:
        """Save the directory at ``path`` as a tar archive at ``target`` (a local file),
        streamed; returns its size in bytes. Raises ``NotFound``, ``VolumeNotFound``,
        ``InvalidRequest`` (not a directory)."""
        call = _base.volume_call("GET", volume, "archive", path=path)
        written = 0
        try:
            async with self._client._http.stream(call.method, call.path, params=call.params) as r:
                if not r.is_success:
                    await r.aread()
                    _base.checked(r)
                with open(target, "wb") as out:
                    async for chunk in r.aiter_bytes():
                        out.write(chunk)
                        written += len(chunk)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self._client._settings.url) from exc
        return written

    async def list_dir(self, volume: str, path: str = "/", *, depth: int = 1) -> _Entries:
        """What a directory holds, ``depth`` levels down. Raises ``NotFound``,
        ``VolumeNotFound``."""
        call = _base.volume_call("GET", volume, "dir", path=path, depth=depth)
        response = await self._client._send(call)
        return [VolumeEntry.model_validate(e) for e in _base.checked(response)]

    async def make_dir(self, volume: str, path: str, *, parents: bool = False) -> VolumeEntry:
        """Make a directory. Raises ``Conflict`` (something is there), ``NotFound``."""
        call = _base.volume_call("POST", volume, "dir", path=path, parents=parents)
        response = await self._client._send(call)
        return VolumeEntry.model_validate(_base.checked(response))

    async def remove(self, volume: str, path: str) -> None:
        """Remove a file, symlink or directory (with what it holds). Raises ``NotFound``."""
        call = _base.volume_call("DELETE", volume, "files", path=path)
        _base.checked(await self._client._send(call))


class AsyncOneShotBrowser:
    """One-shot scrapes: each renders a page in a browser sandbox of the server's
    ``browser_template`` (from its warm pool when one is ready), killed afterwards. For a
    browser that stays open across calls, use a sandbox's (``AsyncSandbox.browser``)."""

    def __init__(self, client: AsyncRingfence) -> None:
        self._client = client

    async def scrape(
        self,
        url: str,
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
        """Open ``url``, do ``actions``, capture the page in ``formats`` (default
        ``["markdown"]``); the arguments are ``AsyncBrowser.scrape``'s. The page reaches
        only what the tenant's default egress policy allows.

        Raises:
            InvalidRequest: a bad argument (checked before sending).
            TooManyRequests: no room for another sandbox now.
            BrowserActionFailed, BrowserTimeout, BrowserUnavailable, BrowserError: as
                ``AsyncBrowser.scrape``. Unauthenticated, ServerUnreachable.
        """
        request = _browser.scrape_request(
            url, formats=formats, actions=actions, only_main_content=only_main_content,
            wait_for=wait_for, timeout=timeout, headers=headers, cookies=cookies,
            firewall=firewall,
        )  # fmt: skip
        call = _base.Call(
            "POST", "/v1/browser/scrape", json=request.model_dump(mode="json", exclude_none=True),
            timeout=_browser.scrape_seconds(request),
        )  # fmt: skip
        return ScrapeResult.model_validate(_base.checked(await self._client._send(call)))


class AsyncProposals:
    """Remediations that run only once a human approves them (see docs/approvals.md)."""

    def __init__(self, client: AsyncRingfence) -> None:
        self._client = client

    async def create(
        self,
        request_or_command: Sequence[str] | ExecutionRequest,
        *,
        rationale: str,
        risk: Risk | str = Risk.LOW,
        session_id: str | None = None,
        task_id: str | None = None,
        **request_fields: Any,
    ) -> Proposal:
        """Propose ``request_or_command`` (a list, or a whole ``ExecutionRequest``); further
        keyword arguments are the request's fields (``timeout=``, ``env=``,
        ``remediation_action=``, ``target_namespace=``...). Returns it ``pending``, with the
        ``digest`` an approval must name. Any key may propose.

        Raises:
            InvalidRequest: a field is invalid, or sets ``checkpoint_id``/``approved_by``.
            Forbidden, Unauthenticated, ServerUnreachable.
        """
        spec = _proposals.build_spec(
            request_or_command, rationale=rationale, risk=risk, session_id=session_id,
            task_id=task_id, fields=request_fields,
        )  # fmt: skip
        response = await self._client._send(_proposals.create_call(spec))
        return _proposals.read_proposal(response)

    async def get(self, proposal_id: str) -> Proposal:
        """Raises ``ProposalNotFound``."""
        response = await self._client._send(_proposals.get_call(proposal_id))
        return _proposals.read_proposal(response)

    async def list(self, *, state: StateFilter = None, limit: int = 100) -> list[Proposal]:
        """Your tenant's proposals, newest first; ``state`` is one state or several."""
        response = await self._client._send(_proposals.list_call(state, limit))
        return _proposals.read_proposals(response)

    async def approve(
        self, proposal_id: str, *, digest: str | None = None, reason: str = ""
    ) -> Proposal:
        """Approve (approver and admin keys); with enough approvals it runs at once, and the
        answer says ``executing``.

        Pass the ``digest`` of the proposal you reviewed: the server refuses the approval if
        the request is not that one. Without it, the proposal is read again and its current
        digest approved: you approve whatever it holds now, not what you looked at.

        Raises:
            ProposalNotFound: no such proposal in your tenant.
            Forbidden: an agent key, or your own proposal.
            Conflict: not pending any more, already approved by you, or another digest.
        """
        if digest is None:
            digest = (await self.get(proposal_id)).digest
        call = _proposals.approve_call(proposal_id, digest, reason)
        return _proposals.read_proposal(await self._client._send(call))

    async def reject(self, proposal_id: str, *, reason: str) -> Proposal:
        """Reject, saying why (approver and admin keys).

        Raises:
            ProposalNotFound, Forbidden (agent keys), Conflict (not pending any more),
            InvalidRequest (an empty reason).
        """
        response = await self._client._send(_proposals.reject_call(proposal_id, reason))
        return _proposals.read_proposal(response)

    async def wait(self, proposal_id: str, timeout: float | None = None) -> Proposal:
        """The proposal once it is ``succeeded``, ``failed``, ``rejected`` or ``expired``,
        polling with a growing interval (at most 2 s). A pending proposal waits for its
        approvals, up to its approval window.

        Raises:
            WaitTimeout: ``timeout`` seconds passed first.
            ProposalNotFound.
        """
        deadline = _proposals.deadline_after(timeout)
        for delay in _proposals.delays():
            proposal = await self.get(proposal_id)
            if proposal.state.is_final:
                return proposal
            if _proposals.past(deadline):
                raise _proposals.timed_out(proposal, timeout)
            await asyncio.sleep(_proposals.pause_before_next_poll(delay, deadline))
        raise AssertionError("unreachable")  # delays() never ends
