"""What a hostile browser agent's answer may cost the control plane: its JSON's structure
is bounded before it is parsed, the parse runs off the event loop, and the bytes of
answers held at once are bounded across the server (``service/browser_agent.py``). The
"agent" is a local TCP server standing in for the sandbox's tunnel (the routes' own tests,
``tests/server/test_browser_routes.py``, answer through a real sandbox)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest

import ringfence.service.browser_agent as browser_agent
from ringfence.errors import BrowserError, ServerAtCapacity
from ringfence.models.browser import ScrapeRequest, ScrapeResult
from ringfence.service.browser_agent import AnswerBytes, BrowserAgent
from ringfence.service.port_tunnel import Pipe

pytestmark = pytest.mark.timeout(120)


def _result(value: str) -> bytes:
    return (
        '{"untrusted":true,"metadata":{"url":"http://x/"},"firewall":{"rules":[]},'
        f'"actions":[{{"type":"execute_javascript","value":{value}}}]}}'
    ).encode()


class _Daemon:
    sandbox_id = "sbxhostile"
    socket_path = "/nonexistent"


@contextlib.asynccontextmanager
async def _agent(
    monkeypatch: pytest.MonkeyPatch, body: bytes, answering: asyncio.Event | None = None
) -> AsyncIterator[None]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body))
        if answering is not None:  # the head only, then the body once the test says
            await writer.drain()
            await answering.wait()
        writer.write(body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def tunnel(*_: object) -> Pipe:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        return Pipe(reader, writer)

    monkeypatch.setattr(browser_agent, "open_tunnel", tunnel)
    async with server:
        yield


async def _worst_stall(during: Callable[[], object]) -> float:
    """The longest the event loop went without running a 10 ms ticker while ``during``
    (a coroutine function) ran."""
    worst = 0.0

    async def ticker() -> None:
        nonlocal worst
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            worst, last = max(worst, now - last), now

    ticking = asyncio.create_task(ticker())
    try:
        await during()  # type: ignore[misc]
    finally:
        ticking.cancel()
    return worst


async def test_a_small_object_bomb_is_refused_without_stalling_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 8 MiB of {} (2.8 million objects): 12.6 s of blocked event loop and +405 MiB before.
    body = _result("[" + ",".join(["{}"] * ((8 << 20) // 3)) + "]")
    async with _agent(monkeypatch, body):
        agent = BrowserAgent(64 << 20)

        async def scrape() -> None:
            with pytest.raises(BrowserError, match="more than 100000 objects and arrays"):
                await agent.scrape(_Daemon(), ScrapeRequest(url="http://x/"))  # type: ignore[arg-type]

        assert await _worst_stall(scrape) < 2.0
        assert agent.buffered.held == 0


async def test_a_flat_bomb_of_values_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    body = _result("[" + ",".join(["1"] * 1_500_000) + "]")
    async with _agent(monkeypatch, body):
        with pytest.raises(BrowserError, match="more than 1000000 values"):
            await BrowserAgent(64 << 20).scrape(_Daemon(), ScrapeRequest(url="http://x/"))  # type: ignore[arg-type]


async def test_long_strings_and_braces_inside_them_are_a_real_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A page's HTML or Markdown holds any number of { [ , in its text: they are no structure.
    text = '{[,\\"' * 400_000
    body = _result(f'"{text}"')
    async with _agent(monkeypatch, body):
        result = await BrowserAgent(64 << 20).scrape(_Daemon(), ScrapeRequest(url="http://x/"))  # type: ignore[arg-type]
    assert isinstance(result, ScrapeResult)
    assert result.actions[0].value == text.replace('\\"', '"')


async def test_answers_held_at_once_are_bounded_across_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two answers of 700 KiB under a bound of 1 MiB: the second waits for the first's
    # bytes, and past BUFFER_WAIT_SECONDS it is a 503 naming the bound.
    body = _result('"' + "x" * (700 << 10) + '"')
    answering = asyncio.Event()
    monkeypatch.setattr(browser_agent, "BUFFER_WAIT_SECONDS", 0.5)
    async with _agent(monkeypatch, body, answering):
        agent = BrowserAgent(1 << 20, 1 << 20)
        first = asyncio.create_task(
            agent.scrape(_Daemon(), ScrapeRequest(url="http://x/"))  # type: ignore[arg-type]
        )
        async with asyncio.timeout(30):
            while agent.buffered.held == 0:  # the first answer's head took its length
                await asyncio.sleep(0.01)
        assert agent.buffered.held == len(body)
        with pytest.raises(ServerAtCapacity, match="max_browser_buffered_bytes is 1048576"):
            await agent.scrape(_Daemon(), ScrapeRequest(url="http://x/"))  # type: ignore[arg-type]
        answering.set()
        assert isinstance(await first, ScrapeResult)
        assert agent.buffered.held == 0
        # Room again: a call that waited is served once the first gives its bytes back.
        answering.clear()
        monkeypatch.setattr(browser_agent, "BUFFER_WAIT_SECONDS", 30.0)
        first = asyncio.create_task(
            agent.scrape(_Daemon(), ScrapeRequest(url="http://x/"))  # type: ignore[arg-type]
        )
        async with asyncio.timeout(30):
            while agent.buffered.held == 0:
                await asyncio.sleep(0.01)
        second = asyncio.create_task(
            agent.scrape(_Daemon(), ScrapeRequest(url="http://x/"))  # type: ignore[arg-type]
        )
        await asyncio.sleep(0)
        answering.set()
        assert isinstance(await first, ScrapeResult)
        assert isinstance(await second, ScrapeResult)
    assert agent.buffered.held == 0


async def test_the_byte_bound_wakes_a_waiter_once_room_is_given_back() -> None:
    bytes_ = AnswerBytes(100)
    await bytes_.take(80)
    waiting = asyncio.create_task(bytes_.take(50))
    await asyncio.sleep(0)
    assert not waiting.done()
    bytes_.give_back(80)
    async with asyncio.timeout(5):
        await waiting
    assert bytes_.held == 50


async def test_a_caller_gone_mid_parse_holds_its_bytes_until_the_parse_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker thread cannot be cancelled: its answer's bytes are still in memory until it
    # ends, so they count until then, not until its caller went away.
    body = _result('"' + "x" * 4096 + '"')
    parsing, release = threading.Event(), threading.Event()

    def slow(answer: object) -> object:
        parsing.set()
        assert release.wait(30)
        return answer

    async with _agent(monkeypatch, body):
        agent = BrowserAgent(1 << 20)
        call = asyncio.create_task(
            agent._call(_Daemon(), "POST", "/scrape", b"{}", 30, slow)  # type: ignore[arg-type]
        )
        assert await asyncio.to_thread(parsing.wait, 30)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert agent.buffered.held == len(body)
        release.set()
        async with asyncio.timeout(30):
            while agent.buffered.held:
                await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("value", "containers"),
    [
        ('"a\\\\"', 0),  # an escaped backslash, then the closing quote
        ('"a\\\\\\"{"', 0),  # an escaped backslash and an escaped quote: one string
        ('["\\\\", {}, "[{", []]', 3),
        ('"' + "\\\\" * 1000 + '"', 0),
        ('"' + "\\\\" * 1000 + '\\"{"', 0),  # an escaped quote past a long run
        ('["' + "\\\\" * 100 + '", {}]', 2),
    ],
)
def test_the_structure_count_ends_strings_where_json_does(
    monkeypatch: pytest.MonkeyPatch, value: str, containers: int
) -> None:
    body = _result(value)
    assert json.loads(body)  # the test's own JSON is JSON
    own = 6  # the result's own objects and arrays around the value
    monkeypatch.setattr(browser_agent, "_MAX_CONTAINERS", own + containers)
    browser_agent._check_structure(_Daemon(), body, "/scrape")  # type: ignore[arg-type]
    monkeypatch.setattr(browser_agent, "_MAX_CONTAINERS", own + containers - 1)
    with pytest.raises(BrowserError, match="objects and arrays"):
        browser_agent._check_structure(_Daemon(), body, "/scrape")  # type: ignore[arg-type]
