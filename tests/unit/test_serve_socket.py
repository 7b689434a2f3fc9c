"""The socket ``ringfence serve`` listens on: its connections send without Nagle's delay."""

from __future__ import annotations

import asyncio
import socket

from ringfence.cli.serve import _bind


async def test_accepted_connections_have_tcp_nodelay() -> None:
    # An answer is written as a head then a body: with Nagle's algorithm on, the body waited
    # for the client's delayed ACK of the head, 40 ms on every keep-alive request.
    listening = _bind("127.0.0.1", 0)
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(accepted, sock=listening)
    try:
        port = listening.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(seen, 10) != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
