"""Talking to a sandbox's daemon through the API by hand: Connect envelopes, commands."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

STREAM = {"content-type": "application/connect+json"}


def envelope(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


async def messages(response: httpx.Response) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """(flags, message) for each envelope of a streamed answer, as it arrives."""
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if len(buffer) < 5 + length:
                break
            yield flags, json.loads(buffer[5 : 5 + length])
            buffer = buffer[5 + length :]
    assert buffer == b"", "the stream ended inside an envelope"


@dataclass
class Ran:
    stdout: str = ""
    stderr: str = ""
    pid: int | None = None
    end: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None


def start_body(cmd: list[str], **fields: Any) -> bytes:
    return envelope({"process": {"cmd": cmd[0], "args": cmd[1:]}, **fields})


async def run(
    client: httpx.AsyncClient,
    headers: dict[str, str],
    sandbox_id: str,
    cmd: list[str],
    user: str | None = None,
    **fields: Any,
) -> Ran:
    """Run ``cmd`` in the sandbox (as ``user``: the sandbox's default when None) and collect
    what it printed and how it ended."""
    ran = Ran()
    async with client.stream(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/Start",
        headers={**headers, **STREAM},
        params={} if user is None else {"user": user},
        content=start_body(cmd, **fields),
    ) as response:
        assert response.status_code == 200, await response.aread()
        async for flags, message in messages(response):
            collect(ran, flags, message)
    return ran


def collect(ran: Ran, flags: int, message: dict[str, Any]) -> None:
    if flags & 2:
        ran.error = message.get("error")
        return
    event = message["event"]
    if "start" in event:
        ran.pid = event["start"]["pid"]
    elif "data" in event:
        for stream in ("stdout", "stderr"):
            if stream in event["data"]:
                text = base64.b64decode(event["data"][stream]).decode()
                setattr(ran, stream, getattr(ran, stream) + text)
    elif "end" in event:
        ran.end = event["end"]
