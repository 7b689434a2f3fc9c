"""The group relay's connections per grouped sandbox are bounded (review 2a #7): each is a
host task and descriptor, and a sandbox opening connections that never finish their head
made the host hold as many as it opened."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from ringfence.service import groups
from ringfence.service.port_tunnel import Pipe

BOUND = 64  # connections of one grouped sandbox served at once


async def test_a_grouped_sandbox_has_at_most_its_bound_of_connections_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ends: list[socket.socket] = []  # the sandbox's process ends: each sends a byte, no head

    async def accept(socket_path: str, sandbox_id: str) -> Pipe:
        ours, theirs = socket.socketpair()
        theirs.sendall(b"G")
        ends.append(theirs)
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        return Pipe(reader, writer)

    monkeypatch.setattr(groups, "open_group_accept", accept)
    relays = groups.GroupRelays(ports=None)  # type: ignore[arg-type]  # never reached
    daemon: Any = type("Daemon", (), {"socket_path": "/nonexistent"})()
    relays.start("acme", "sb1", "g", daemon)
    try:
        async with asyncio.timeout(10):
            while len(ends) < BOUND:
                await asyncio.sleep(0.01)
        for _ in range(200):  # the loop runs the waiters many times: none accepts more
            await asyncio.sleep(0)
        assert len(ends) == BOUND
        ends[0].close()  # one connection ends (its head never came): a slot comes back
        async with asyncio.timeout(10):
            while len(ends) == BOUND:
                await asyncio.sleep(0.01)
        assert len(ends) == BOUND + 1
    finally:
        await relays.aclose()
        for end in ends:
            end.close()
