"""A unix socket on the control plane's side that carries each connection to a Pod's
daemon over TCP (pod IP, daemon port).

The service layer reaches every daemon through a unix socket path (``LiveSandbox``), the
local backend's transport; the relay lets a Pod be reached the same way, so the daemon
client, its limits and its header allowlists stay one code path. The hop costs a copy of
the bytes in this process, small beside the network hop to the Pod.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

__all__ = ["Relay"]

_CHUNK = 64 * 1024
_CONNECT_SECONDS = 10.0


class Relay:
    """Listens on ``path``; each connection is piped to ``host:port`` until either side ends."""

    def __init__(self, path: Path, host: str, port: int) -> None:
        self.path = path
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Raises ``OSError`` when the socket cannot be created."""
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.path))
        self.path.chmod(0o600)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        self.path.unlink(missing_ok=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            try:
                upstream = await asyncio.wait_for(
                    asyncio.open_connection(self._host, self._port), _CONNECT_SECONDS
                )
            except (OSError, TimeoutError):
                return  # closing tells the client: the daemon is not there
            up_reader, up_writer = upstream
            # The client may half-close (its request is complete); the daemon's end closes
            # the whole connection, as a direct connection to it would be closed.
            requests = asyncio.create_task(_pipe(reader, up_writer))
            try:
                await _pipe(up_reader, writer)
            finally:
                requests.cancel()
                await asyncio.gather(requests, return_exceptions=True)
                up_writer.close()
        except asyncio.CancelledError:
            pass  # the relay is closing: the connection ends with it
        finally:
            writer.close()
            self._pipes.discard(task)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while chunk := await source.read(_CHUNK):
            sink.write(chunk)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
