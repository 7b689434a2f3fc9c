"""``AsyncRingfence``: the SDK's async client (the source of truth; ``Ringfence`` mirrors it)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx

from ringfence.client import _base
from ringfence.client._proposals import AsyncProposals
from ringfence.models import ExecutionRequest, ExecutionResult, Status

__all__ = ["AsyncRingfence"]


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

    async def _send(self, call: _base.Call) -> httpx.Response:
        try:
            return await self._http.request(
                call.method, call.path, params=call.params, json=call.json
            )
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
