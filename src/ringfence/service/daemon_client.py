"""The control plane's side of a sandbox daemon: HTTP over the daemon's unix socket.

The daemon is inside the sandbox, so everything it answers is untrusted: answers are
streamed through (never buffered whole), and the headers that cross are an allowlist in each
direction. Above all the caller's credentials never cross: the daemon never sees an API key.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from pathlib import Path

import httpx

from ringfence.errors import SandboxNotRunning

__all__ = ["FORWARDED_REQUEST_HEADERS", "FORWARDED_RESPONSE_HEADERS", "DaemonClient"]

# What a client may tell the daemon: the Connect protocol's own headers, and the body's type.
FORWARDED_REQUEST_HEADERS = frozenset(
    {
        "content-type",
        "content-encoding",
        "connect-protocol-version",
        "connect-timeout-ms",
        "connect-content-encoding",
        "connect-accept-encoding",
        "keepalive-ping-interval",
    }
)
FORWARDED_RESPONSE_HEADERS = frozenset({"content-type", "content-length"})

# Streams (commands, watches) stay open as long as they run: no read deadline. Connecting
# to a live daemon's socket is immediate; one that takes longer is stuck.
_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=10.0)
_LIMITS = httpx.Limits(max_connections=512, max_keepalive_connections=16)


class DaemonClient:
    """Requests to one sandbox's daemon. ``aclose`` when the sandbox ends."""

    def __init__(self, sandbox_id: str, socket_path: Path) -> None:
        self._sandbox_id = sandbox_id
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket_path), limits=_LIMITS, retries=0),
            base_url="http://sandbox",
            timeout=_TIMEOUT,
        )

    async def health(self, timeout: float) -> None:
        """Wait until the daemon answers (the first request waits in the backlog while
        the daemon starts).

        Raises:
            SandboxNotRunning: it did not answer within ``timeout`` seconds.
        """
        try:
            response = await self._client.get("/health", timeout=timeout)
        except httpx.HTTPError as exc:
            raise self._gone(exc) from exc
        if response.status_code != 204:
            raise SandboxNotRunning(
                f"sandbox {self._sandbox_id}: its daemon answered /health with "
                f"HTTP {response.status_code}"
            )

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        content: AsyncIterable[bytes] | bytes | None = None,
    ) -> httpx.Response:
        """Send a request; the answer's body is left to stream (``aclose`` it).

        Only ``FORWARDED_REQUEST_HEADERS`` of ``headers`` are sent.

        Raises:
            SandboxNotRunning: the daemon cannot be reached (the sandbox has ended).
        """
        kept = {k: v for k, v in (headers or {}).items() if k.lower() in FORWARDED_REQUEST_HEADERS}
        request = self._client.build_request(
            method, path, params=params, headers=kept, content=content
        )
        try:
            return await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._gone(exc) from exc

    async def aclose(self) -> None:
        await self._client.aclose()

    def _gone(self, exc: httpx.HTTPError) -> SandboxNotRunning:
        return SandboxNotRunning(
            f"sandbox {self._sandbox_id} is not running (its daemon cannot be reached: {exc})"
        )
