"""The SDK's link to a sandbox against answers a hostile or dying sandbox could give.

The Ringfence server is simulated with ``httpx.MockTransport``: what is under test is how the
SDK reads what comes back, whatever the sandbox behind the server sends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from ringfence.client._files import AsyncFiles
from ringfence.client._link import MAX_ANSWER, Link
from ringfence.errors import SandboxError
from tests.client.conftest import FROM_SANDBOX as _SANDBOX
from tests.client.conftest import frame
from tests.client.conftest import mock_link as _link

_CHUNK = 64 * 1024


class Endless(httpx.AsyncByteStream):
    """A JSON object that goes on (up to 4 times the cap); counts what was read of it."""

    def __init__(self) -> None:
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"x": "'
        while self.sent < 4 * MAX_ANSWER:
            self.sent += _CHUNK
            yield b"a" * _CHUNK
        yield b'"}'


@pytest.mark.parametrize("status", [200, 500])
async def test_an_endless_unary_answer_is_cut_off(status: int) -> None:
    body = Endless()
    link = _link(lambda _: httpx.Response(status, headers=_SANDBOX, stream=body))
    with pytest.raises(SandboxError) as raised:
        await link.unary("filesystem.Filesystem", "Stat", {"path": "x"})
    assert raised.value.code == SandboxError.code
    assert body.sent <= MAX_ANSWER + _CHUNK
    await link.aclose()


async def test_an_endless_upload_answer_is_cut_off() -> None:
    body = Endless()
    link = _link(lambda _: httpx.Response(200, headers=_SANDBOX, stream=body))
    with pytest.raises(SandboxError) as raised:
        await link.upload("x", b"data")
    assert raised.value.code == SandboxError.code
    assert body.sent <= MAX_ANSWER + _CHUNK
    await link.aclose()


async def test_answers_within_the_cap_are_read_whole() -> None:
    link = _link(lambda _: httpx.Response(200, headers=_SANDBOX, json={"entry": {"n": 1}}))
    assert await link.unary("filesystem.Filesystem", "Stat", {"path": "x"}) == {"entry": {"n": 1}}
    assert await link.upload("x", b"data") == {"entry": {"n": 1}}
    await link.aclose()


def _streaming(body: bytes) -> Link:
    headers = {**_SANDBOX, "content-type": "application/connect+json"}
    stream = httpx.ByteStream(body)
    return _link(lambda _: httpx.Response(200, headers=headers, stream=stream))


@pytest.mark.parametrize("tail", [b"", frame({"n": 3})[:7]], ids=["at-a-frame", "mid-frame"])
async def test_a_stream_cut_short_is_a_sandbox_error_after_its_messages(tail: bytes) -> None:
    link = _streaming(frame({"n": 1}) + frame({"keepalive": {}}) + frame({"n": 2}) + tail)
    stream = await link.stream("filesystem.Filesystem", "WatchDir", {"path": "x"})
    assert [await stream.next(), await stream.next()] == [{"n": 1}, {"n": 2}]
    for _ in range(2):  # and every later read
        with pytest.raises(SandboxError) as raised:
            await stream.next()
        assert raised.value.code == SandboxError.code
    await stream.aclose()
    await link.aclose()


async def test_a_stream_with_its_end_frame_ends_cleanly() -> None:
    link = _streaming(frame({"n": 1}) + frame({}, flags=2))
    stream = await link.stream("filesystem.Filesystem", "WatchDir", {"path": "x"})
    assert [await stream.next(), await stream.next(), await stream.next()] == [{"n": 1}, None, None]
    await stream.aclose()
    await link.aclose()


async def test_a_watch_cut_short_raises_after_its_events() -> None:
    event = {"filesystem": {"name": "f", "type": "EVENT_TYPE_CREATE"}}
    files = AsyncFiles(_streaming(frame({"start": {}}) + frame(event)))
    watch = await files.watch_dir("x")
    seen = []
    with pytest.raises(SandboxError) as raised:
        async for change in watch:
            seen.append(change.name)
    assert seen == ["f"] and raised.value.code == SandboxError.code
    with pytest.raises(SandboxError):  # and so does every later read
        watch.get_new_events()
    await watch.stop()
