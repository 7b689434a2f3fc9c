"""The boundary with the official ``kubernetes`` client: loading it (lazily: it is an
optional extra), connecting, and translating its exceptions into Ringfence's.

The client is synchronous; its calls run on a thread pool of their own (watches and log
streams hold a thread each for as long as an execution runs), never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ringfence.errors import (
    BackendUnavailable,
    Conflict,
    DuplicateExecution,
    ExecutionNotFound,
    InvalidRequest,
    RingfenceError,
    SandboxError,
)

__all__ = ["Cluster", "translated"]

T = TypeVar("T")
_THREADS = 256


def _import() -> Any:
    try:
        import kubernetes
    except ImportError as exc:
        raise BackendUnavailable(
            "the job backend needs the Kubernetes client: pip install 'ringfence[kubernetes]'"
        ) from exc
    return kubernetes


class Cluster:
    """The API groups Ringfence uses, on one connection pool, with their own threads."""

    def __init__(self) -> None:
        """Connect with the in-cluster service account, else the kubeconfig (KUBECONFIG).

        Raises:
            BackendUnavailable: no client library, or no cluster configured.
        """
        kubernetes = _import()
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            try:
                kubernetes.config.load_kube_config()
            except (kubernetes.config.ConfigException, OSError, TypeError) as exc:
                raise BackendUnavailable(
                    "no Kubernetes cluster: not running in a Pod, and no usable kubeconfig "
                    f"(KUBECONFIG or ~/.kube/config): {exc}"
                ) from exc
        self.api = kubernetes.client.ApiClient()
        self.batch = kubernetes.client.BatchV1Api(self.api)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.watch_class: Callable[[], Any] = kubernetes.watch.Watch
        self.threads = ThreadPoolExecutor(_THREADS, thread_name_prefix="ringfence-k8s")

    def plain(self, obj: Any) -> Any:
        """A client model as the API's JSON (camelCase keys), which the pure code reads."""
        return self.api.sanitize_for_serialization(obj)

    async def call(self, doing: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking client call on the pool, its exceptions translated.

        Raises:
            RingfenceError: see ``translated``.
        """
        loop = asyncio.get_running_loop()
        bound = functools.partial(_translating, doing, function, *args, **kwargs)
        return await loop.run_in_executor(self.threads, bound)

    def close(self) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(Exception):  # boundary: closing must not fail a shutdown
            self.api.close()


def _translating(doing: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    with translated(doing):
        return function(*args, **kwargs)


@contextlib.contextmanager
def translated(doing: str) -> Iterator[None]:
    """Translate what the client raises while ``doing`` (e.g. "creating Job rf-x-…").

    Raises:
        ExecutionNotFound: 404.
        DuplicateExecution: 409 AlreadyExists.
        Conflict: another 409.
        InvalidRequest: 400 or 422 (the API server refused the object; its message says why).
        SandboxError: 401/403 (the service account may not), 5xx, or no answer at all.
    """
    try:
        yield
    except RingfenceError:
        raise
    except Exception as exc:  # boundary: only the client's own errors are translated
        translated_error = translate(doing, exc)
        if translated_error is None:
            raise
        raise translated_error from exc


def translate(doing: str, exc: BaseException) -> RingfenceError | None:
    """The Ringfence error for a client exception, or None if it is not one of the client's."""
    kubernetes = _import()
    if isinstance(exc, kubernetes.client.exceptions.ApiException):
        status = exc.status or 0
        why, message = _api_status(exc)
        if status == 404:
            return ExecutionNotFound(f"{doing}: not found")
        if status == 409 and why == "AlreadyExists":
            return DuplicateExecution(f"{doing}: it already exists")
        if status == 409:
            return Conflict(f"{doing}: {message}")
        if status in (400, 422):
            return InvalidRequest(f"{doing}: the API server refused it: {message}")
        if status in (401, 403):
            return SandboxError(
                f"{doing}: the control plane's service account may not do this ({message}); "
                "apply the Role of ringfence k8s render"
            )
        return SandboxError(f"{doing}: the Kubernetes API answered {status}: {message}")
    import urllib3

    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
        return SandboxError(f"{doing}: the Kubernetes API is unreachable: {exc}")
    return None


def _api_status(exc: Any) -> tuple[str, str]:
    """The API's Status object in an error's body: its reason word and its message."""
    import json

    fallback = str(exc.reason or "no reason given")
    try:
        body = json.loads(exc.body or "")
    except (ValueError, TypeError):
        return "", fallback
    if not isinstance(body, dict):
        return "", fallback
    return str(body.get("reason") or ""), str(body.get("message") or fallback)[:500]
