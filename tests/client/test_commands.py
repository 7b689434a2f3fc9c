"""Commands against process streams a hostile or broken sandbox could send."""

from __future__ import annotations

import httpx
import pytest

from ringfence.client._commands import AsyncCommands
from ringfence.errors import SandboxError
from tests.client.conftest import FROM_SANDBOX, frame, mock_link


def _answering(*frames: bytes) -> AsyncCommands:
    body = b"".join(frames)
    headers = {**FROM_SANDBOX, "content-type": "application/connect+json"}
    stream = httpx.ByteStream(body)
    return AsyncCommands(mock_link(lambda _: httpx.Response(200, headers=headers, stream=stream)))


START = frame({"event": {"start": {"pid": 7}}})
END = frame({"event": {"end": {"exited": True, "status": "exit status 0"}}}) + frame({}, 2)


@pytest.mark.parametrize("stdout", ["not base64!", "YQ", "\u00e9"])
async def test_output_that_is_not_base64_is_a_sandbox_error(stdout: str) -> None:
    commands = _answering(START, frame({"event": {"data": {"stdout": stdout}}}), END)
    with pytest.raises(SandboxError) as raised:
        await commands.run("true")
    assert raised.value.code == SandboxError.code


@pytest.mark.parametrize(
    "frames",
    [
        (frame({"event": {"start": {"pid": "seven"}}}), END),
        (START, frame({"event": {"end": {"exited": True, "exitCode": [1]}}}), frame({}, 2)),
        (frame({"event": ["start"]}), END),
    ],
)
async def test_malformed_numbers_and_events_are_sandbox_errors(frames: tuple[bytes, ...]) -> None:
    with pytest.raises(SandboxError) as raised:
        await _answering(*frames).run("true")
    assert raised.value.code == SandboxError.code


async def test_a_well_formed_stream_runs() -> None:
    result = await _answering(START, frame({"event": {"data": {"stdout": "aGkK"}}}), END).run("x")
    assert (result.stdout, result.exit_code) == ("hi\n", 0)
