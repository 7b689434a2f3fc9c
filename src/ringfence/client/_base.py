"""What both SDK clients share: settings, the requests they build, how answers are read.

The async and the sync client are thin I/O shells over these pure helpers.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from ringfence.errors import (
    ExecutionNotFound,
    InvalidRequest,
    NotFound,
    RingfenceError,
    ServerUnreachable,
    error_for,
)
from ringfence.models import ExecutionRequest, ExecutionResult, NetworkPolicy, Status, problems

__all__ = [
    "Call",
    "Settings",
    "build_request",
    "cancel_call",
    "checked",
    "get_call",
    "list_call",
    "network_policy",
    "read_result",
    "read_results",
    "submit_call",
    "translate",
]

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class Settings:
    """Where the server is and how to sign in: arguments, else RINGFENCE_URL and
    RINGFENCE_API_KEY."""

    url: str
    api_key: str
    timeout: float

    @classmethod
    def resolve(cls, url: str | None, api_key: str | None, timeout: float) -> Settings:
        """Raises ``InvalidRequest`` when no key is given either way."""
        key = api_key or os.environ.get("RINGFENCE_API_KEY")
        if not key:
            raise InvalidRequest("no API key: pass api_key= or set RINGFENCE_API_KEY")
        base = url or os.environ.get("RINGFENCE_URL") or DEFAULT_URL
        return cls(base.rstrip("/"), key, timeout)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS settings (its CA bundle, SSL_CERT_FILE and SSL_CERT_DIR honoured),
    made once per process: making them costs ~40 ms, which every new ``httpx.AsyncClient``
    (one per sandbox object) would pay again."""
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class Call:
    """One HTTP request, built without doing any I/O."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None  # a raw body (a file's bytes), instead of ``json``
    timeout: float | None = None  # seconds; None: the client's own


def timeout_of(call: Call) -> float | httpx._client.UseClientDefault:
    """The timeout to give httpx for ``call``: its own, else the client's."""
    return httpx.USE_CLIENT_DEFAULT if call.timeout is None else call.timeout


def build_request(
    command: Sequence[str] | ExecutionRequest, fields: Mapping[str, Any]
) -> ExecutionRequest:
    """An ``ExecutionRequest`` from a command and keyword fields, or the one given.

    Raises:
        InvalidRequest: a field is invalid (checked here, before anything is sent).
    """
    if isinstance(command, ExecutionRequest):
        return command
    if fields.get("network") is not None:
        fields = {**fields, "network": network_policy(fields["network"])}
    try:
        return ExecutionRequest(command=list(command), **fields)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidRequest(problems(exc)) from exc


def network_policy(policy: NetworkPolicy | Mapping[str, Any]) -> NetworkPolicy:
    """An egress policy from a ``NetworkPolicy`` or its JSON form
    (``{"rules": [{"domain": "pypi.org"}]}``), checked before anything is sent.

    Raises:
        InvalidRequest: it is not a valid policy (a pattern too broad, a bad port...).
    """
    if isinstance(policy, NetworkPolicy):
        return policy
    if not isinstance(policy, Mapping):
        raise InvalidRequest(f"network: a NetworkPolicy or a mapping, not {type(policy).__name__}")
    try:
        return NetworkPolicy.model_validate(dict(policy))
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidRequest(f"network: {exc}") from exc


def submit_call(request: ExecutionRequest, wait: bool) -> Call:
    body = request.model_dump(mode="json", exclude_none=True)
    return Call("POST", "/v1/executions", {"wait": str(wait).lower()}, body)


def snapshot_call(method: str, snapshot_id: str | None = None, limit: int = 100) -> Call:
    """A call on ``/v1/snapshots`` (a listing without ``snapshot_id``)."""
    if snapshot_id is None:
        return Call(method, "/v1/snapshots", params={"limit": limit})
    return Call(method, f"/v1/snapshots/{_segment(snapshot_id)}")


def volume_call(
    method: str, volume: str | None = None, part: str = "", *, content: bytes | None = None,
    json: Any = None, **params: Any,
) -> Call:  # fmt: skip
    """A call on ``/v1/volumes`` (``volume``: its name or id; ``part``: ``files``,
    ``stat``, ``dir``); parameters that are None are left out."""
    path = "/v1/volumes" if volume is None else f"/v1/volumes/{_segment(volume)}"
    if part:
        path += f"/{part}"
    given = {name: value for name, value in params.items() if value is not None}
    return Call(method, path, given, json, content)


def get_call(execution_id: str) -> Call:
    return Call("GET", f"/v1/executions/{_segment(execution_id)}")


def cancel_call(execution_id: str) -> Call:
    return Call("POST", f"/v1/executions/{_segment(execution_id)}/cancel")


def list_call(status: Status | None, limit: int) -> Call:
    params: dict[str, Any] = {"limit": limit}
    if status is not None:
        params["status"] = Status(status).value
    return Call("GET", "/v1/executions", params)


def read_result(response: httpx.Response) -> ExecutionResult:
    return ExecutionResult.model_validate(checked(response, ExecutionNotFound))


def read_results(response: httpx.Response) -> list[ExecutionResult]:
    return [ExecutionResult.model_validate(item) for item in checked(response)]


def translate(exc: httpx.HTTPError, url: str) -> RingfenceError:
    """A transport failure, in Ringfence's terms."""
    return ServerUnreachable(f"cannot reach the Ringfence server at {url}: {exc}")


def checked(response: httpx.Response, not_found: type[NotFound] = NotFound) -> Any:
    """The JSON body of a success (None for a 204); the typed error of a failure.

    Raises:
        RingfenceError: the subclass named by the server's error code; ``not_found`` (what
            was looked up) for ``not_found``.
    """
    if response.status_code == 204:  # done, nothing to say
        return None
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_success and body is not None:
        return body
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        message = str(error.get("message", ""))
        if error["code"] == NotFound.code:
            raise not_found(message)
        raise error_for(error["code"], message)
    raise RingfenceError(f"unexpected answer from the server: HTTP {response.status_code}")


def _segment(execution_id: str) -> str:
    return quote(execution_id, safe="")
