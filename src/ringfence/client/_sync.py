"""``Ringfence``: the synchronous twin of ``AsyncRingfence`` (same helpers, blocking I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx

from ringfence.client import _base
from ringfence.client._proposals import Proposals
from ringfence.models import ExecutionRequest, ExecutionResult, Status

__all__ = ["Ringfence"]


class Ringfence:
    """The blocking client; see ``AsyncRingfence`` for the arguments and errors."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 600.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._settings = _base.Settings.resolve(url, api_key, timeout)
        self._http = httpx.Client(
            base_url=self._settings.url, headers=self._settings.headers(),
            timeout=timeout, transport=transport,
        )  # fmt: skip
        self.executions = Executions(self)
        self.proposals = Proposals(self)

    def _send(self, call: _base.Call) -> httpx.Response:
        try:
            return self._http.request(call.method, call.path, params=call.params, json=call.json)
        except httpx.HTTPError as exc:
            raise _base.translate(exc, self._settings.url) from exc

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Ringfence:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Executions:
    """One-shot executions; see ``AsyncExecutions``."""

    def __init__(self, client: Ringfence) -> None:
        self._client = client

    def run(
        self, command: Sequence[str] | ExecutionRequest, *, wait: bool = True, **fields: Any
    ) -> ExecutionResult:
        request = _base.build_request(command, fields)
        return _base.read_result(self._client._send(_base.submit_call(request, wait)))

    def get(self, execution_id: str) -> ExecutionResult:
        return _base.read_result(self._client._send(_base.get_call(execution_id)))

    def cancel(self, execution_id: str) -> ExecutionResult:
        return _base.read_result(self._client._send(_base.cancel_call(execution_id)))

    def list(self, *, status: Status | None = None, limit: int = 100) -> list[ExecutionResult]:
        return _base.read_results(self._client._send(_base.list_call(status, limit)))
