"""The SDK's link to a sandbox against answers a hostile or dying sandbox could give.

The Ringfence server is simulated with ``httpx.MockTransport``: what is under test is how the
SDK reads what comes back, whatever the sandbox behind the server sends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from ringfence.client._link import MAX_ANSWER
from ringfence.errors import SandboxError
from tests.client.conftest import FROM_SANDBOX as _SANDBOX
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
