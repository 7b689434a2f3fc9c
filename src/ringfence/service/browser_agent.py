"""The control plane's side of a sandbox's browser agent (``sandboxd.browser``).

The agent is a process inside the sandbox, started through the sandbox's daemon like any
command (as the sandbox's user, under its limits) and left running: a process whose
``Start`` stream its caller leaves is not killed (``sandboxd/_process_rpc.py``). It listens
on ``AGENT_PORT`` of the sandbox's loopback, reached here through the daemon's port tunnel
(``port_tunnel.open_tunnel``), one connection per call, HTTP/1.1 parsed by h11.

It is started on a sandbox's first call that finds nothing listening there, once however
many calls arrive together (they wait on one start, per daemon socket), and again should
it have died (the sandbox's memory limit, a resume from disk, which starts processes
afresh). A start is done when the agent answers ``/health``, bounded by
``START_SECONDS``; an agent that exits first fails the start with what it printed.

Everything the agent answers is the sandbox's, untrusted: the answer's head is bounded by
h11, its body by ``max_browser_result_bytes``, the whole call by the request's own
``timeout`` plus ``CALL_MARGIN_SECONDS``; the body must be JSON of the documented shape,
else the call fails as ``BrowserError`` (502) naming what was wrong, never a 500.

JSON's cost is in its nodes, not its bytes (``{}`` is 3 bytes on the wire and about 70 as a
Python dict, walked and validated after), so an answer's structure is counted before it is
parsed (``_MAX_CONTAINERS`` objects and arrays, ``_MAX_NODES`` in all): a real result's bulk
is long strings (Markdown, HTML, screenshots), its structure small. The count, the parse and
the validation run in a worker thread, not on the event loop every tenant's requests and
the egress gateway share; and the bytes of answers held at once across the server, from
their first byte to their validation's end, are bounded by ``max_browser_buffered_bytes``
(``AnswerBytes``): a call that finds no room within ``BUFFER_WAIT_SECONDS`` fails as
``ServerAtCapacity`` (503). The agent's error codes map to these classes (its message,
clipped, is passed on):

    ==================  ======================  ======
    agent's code        raised here             status
    ==================  ======================  ======
    invalid_request     InvalidRequest          400
    action_failed       BrowserActionFailed     422
    timeout             BrowserTimeout          504
    unavailable         BrowserUnavailable      503
    browser_failed      BrowserError            502
    (anything else)     BrowserError            502
    ==================  ======================  ======
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import math
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import h11
from pydantic import BaseModel, ValidationError

from ringfence.errors import (
    BrowserActionFailed,
    BrowserError,
    BrowserTimeout,
    BrowserUnavailable,
    InvalidRequest,
    PortNotListening,
    RingfenceError,
    ServerAtCapacity,
)
from ringfence.models.browser import BrowserStatus, ScrapeRequest, ScrapeResult
from ringfence.sandboxd.browser import AGENT_PORT
from ringfence.sandboxd.methods import PROCESS, SANDBOX_USER
from ringfence.service.daemon_client import DaemonClient, DaemonResponse
from ringfence.service.pool import Warm
from ringfence.service.port_tunnel import Pipe, open_tunnel

__all__ = [
    "AGENT_COMMAND",
    "BUFFER_WAIT_SECONDS",
    "CALL_MARGIN_SECONDS",
    "START_SECONDS",
    "AnswerBytes",
    "BrowserAgent",
]

# How the agent is started (its package docstring): the template's python3, isolated (-I)
# but with its site-packages (no -S: the Markdown converter is there), no bytecode written.
AGENT_COMMAND: tuple[str, ...] = (
    "python3", "-I", "-B", "-c",
    "import sys; sys.path.insert(0, '/run/ringfence'); import sandboxd.browser.__main__",
    "--port", str(AGENT_PORT),
)  # fmt: skip
START_SECONDS = 30.0  # from the start to its first answer (a loaded 2-core host: ~1 s)
CALL_MARGIN_SECONDS = 15.0  # past a scrape's own timeout: the agent's answer is that late
_CONTROL_SECONDS = 60.0  # /start (Chromium's cold start), /close, /cdp, /health
# Between probes while it starts: a probe is one tunnel through the daemon (about 1 ms),
# and an agent listens about 250 ms after its start, so a backoff (20 ms up to 300 ms)
# saw it about 120 ms late on every cold scrape (15.7); 30 s of probes is 1 200 at most.
_POLL_SECONDS = 0.025
_MAX_HEAD = 16 * 1024
_MAX_ERROR = 64 * 1024  # an error answer's body
_MAX_OUTPUT = 4096  # what a failed start keeps of the agent's output
_MAX_DEPTH = 128  # containers in an answer's JSON (a script's value included)
# An answer's structure: a real result has a few dozen objects besides its script values
# and at most 10 000 links; 100 000 containers cost about 10 MiB parsed, 1 000 000 nodes
# (strings, containers, the commas between values) about 60 MiB, each well under a second.
_MAX_CONTAINERS = 100_000
_MAX_NODES = 1_000_000
BUFFER_WAIT_SECONDS = 10.0  # for room under max_browser_buffered_bytes, then a 503
_CHUNK = 64 * 1024
_CDP_PATH = re.compile(r"^/devtools/browser/[A-Za-z0-9._-]{1,128}$")

_ERRORS: dict[str, type[RingfenceError]] = {
    "invalid_request": InvalidRequest,
    "action_failed": BrowserActionFailed,
    "timeout": BrowserTimeout,
    "unavailable": BrowserUnavailable,
    "browser_failed": BrowserError,
}

_Model = TypeVar("_Model", bound=BaseModel)


class AnswerBytes:
    """The bytes of agents' answers the server holds at once, across every sandox and
    tenant (``Config.max_browser_buffered_bytes``): taken as they arrive (an answer's whole
    ``Content-Length`` at its head), given back once the answer is parsed and validated."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0
        self._waiters: list[asyncio.Future[None]] = []

    async def take(self, size: int) -> None:
        """Hold ``size`` more bytes, waiting up to ``BUFFER_WAIT_SECONDS`` for room.

        Raises:
            ServerAtCapacity: no room within the wait (or ``size`` is past the whole bound).
        """
        try:
            async with asyncio.timeout(BUFFER_WAIT_SECONDS if size <= self.total else 0):
                while self.held + size > self.total:
                    waiter = asyncio.get_running_loop().create_future()
                    self._waiters.append(waiter)
                    try:
                        await waiter
                    finally:
                        self._waiters.remove(waiter)
        except TimeoutError:
            raise ServerAtCapacity(
                f"the server holds {self.held} bytes of browser answers at once "
                f"(max_browser_buffered_bytes is {self.total}); retry later"
            ) from None
        self.held += size

    def give_back(self, size: int) -> None:
        self.held -= size
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)


class _Held:
    """What one call holds of ``AnswerBytes``."""

    __slots__ = ("_budget", "size")

    def __init__(self, budget: AnswerBytes) -> None:
        self._budget = budget
        self.size = 0

    async def take(self, size: int) -> None:
        await self._budget.take(size)
        self.size += size

    def give_back(self) -> None:
        self._budget.give_back(self.size)
        self.size = 0


class BrowserAgent:
    """Calls to the browser agents of sandboxes, each started on demand.

    Every method takes the sandbox's ``DaemonClient`` (found, resumed and touched by the
    caller) and may raise, besides what it documents, what reaching the daemon raises
    (``SandboxNotRunning``, ``SandboxError``), ``BrowserError`` for an agent that does not
    speak its protocol and ``ServerAtCapacity`` when the server holds all the answer bytes
    it may."""

    def __init__(self, max_result_bytes: int, max_buffered_bytes: int | None = None) -> None:
        """``max_result_bytes``: the largest answer taken from an agent
        (``Config.max_browser_result_bytes``); ``max_buffered_bytes``: the bytes of answers
        held at once across every call (``Config.max_browser_buffered_bytes``; by default
        four of the largest)."""
        self._max_result_bytes = max_result_bytes
        self.buffered = AnswerBytes(max_buffered_bytes or 4 * max_result_bytes)
        # One start at a time per daemon (keyed by its socket: a pooled sandbox's daemon
        # client is renamed at its claim, its socket is not).
        self._starting: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    async def scrape(self, daemon: DaemonClient, request: ScrapeRequest) -> ScrapeResult:
        """The agent's ``POST /scrape`` (the agent started first if need be).

        Raises:
            BrowserActionFailed, BrowserTimeout, BrowserUnavailable, BrowserError,
            InvalidRequest: as the agent answered (the module's table).
        """
        body = request.model_dump_json(exclude_unset=False).encode()
        seconds = request.timeout / 1000 + CALL_MARGIN_SECONDS
        decode = functools.partial(_parsed, daemon, ScrapeResult, path="/scrape")
        return await self._started_call(daemon, "POST", "/scrape", body, seconds, decode)

    async def start(self, daemon: DaemonClient) -> BrowserStatus:
        """Start the agent and its Chromium (``POST /start``): a warm sandbox's preparation.

        Raises:
            BrowserUnavailable: the template has no Chromium.
        """
        decode = functools.partial(_parsed, daemon, BrowserStatus, path="/start")
        return await self._started_call(daemon, "POST", "/start", b"", _CONTROL_SECONDS, decode)

    async def prepare(self, warm: Warm) -> None:
        """A warm pool's prepare of a browser sandbox: its agent and Chromium started, so
        that its claimer's first scrape renders at once."""
        await self.start(warm.daemon)

    async def status(self, daemon: DaemonClient) -> BrowserStatus:
        """The agent's ``GET /health``; not running (and not started) when no agent
        listens."""
        decode = functools.partial(_parsed, daemon, BrowserStatus, path="/health")
        try:
            return await self._call(daemon, "GET", "/health", None, _CONTROL_SECONDS, decode)
        except PortNotListening:
            return BrowserStatus(running=False)

    async def close(self, daemon: DaemonClient) -> BrowserStatus:
        """End the sandbox's Chromium (``POST /close``; the agent stays); nothing to do when
        no agent listens."""
        decode = functools.partial(_parsed, daemon, BrowserStatus, path="/close")
        try:
            return await self._call(daemon, "POST", "/close", b"", _CONTROL_SECONDS, decode)
        except PortNotListening:
            return BrowserStatus(running=False)

    async def cdp_path(self, daemon: DaemonClient) -> str:
        """The WebSocket path of the browser target on ``CDP_PORT`` (``GET /cdp``: the
        agent and Chromium started first if need be).

        Raises:
            BrowserUnavailable: the template has no Chromium.
        """
        decode = functools.partial(_json, daemon, path="/cdp")
        answer = await self._started_call(daemon, "GET", "/cdp", None, _CONTROL_SECONDS, decode)
        path = answer.get("path")
        if not isinstance(path, str) or _CDP_PATH.match(path) is None:
            raise _garbage(daemon, "/cdp", "no browser target path (/devtools/browser/<id>)")
        return path

    async def _started_call(
        self,
        daemon: DaemonClient,
        method: str,
        path: str,
        body: bytes | None,
        seconds: float,
        decode: Callable[[_Answer], _Decoded],
    ) -> _Decoded:
        """A call to the agent, started first if nothing listens on its port."""
        try:
            return await self._call(daemon, method, path, body, seconds, decode)
        except PortNotListening:
            pass
        await self._ensure_started(daemon)
        try:
            return await self._call(daemon, method, path, body, seconds, decode)
        except PortNotListening as exc:  # started, answered, and gone again at once
            raise BrowserError(
                f"sandbox {daemon.sandbox_id}: its browser agent stopped listening just "
                "after it started"
            ) from exc

    async def _ensure_started(self, daemon: DaemonClient) -> None:
        """Start the agent unless one listens (checked again under the start's lock, so
        calls that found none together start one)."""
        lock = self._starting.get(daemon.socket_path)
        if lock is None:
            lock = self._starting[daemon.socket_path] = asyncio.Lock()
        async with lock:
            if await self._listening(daemon):
                return
            await self._launch(daemon)

    async def _listening(self, daemon: DaemonClient) -> bool:
        try:
            pipe = await open_tunnel(daemon.socket_path, daemon.sandbox_id, AGENT_PORT)
        except PortNotListening:
            return False
        await pipe.aclose()
        return True

    async def _launch(self, daemon: DaemonClient) -> None:
        """Start the agent through the daemon's process service, leave its stream (the
        process stays), and wait until it answers ``/health``.

        Raises:
            BrowserError: it exited first, or did not answer within ``START_SECONDS``.
        """
        message = {
            "process": {"cmd": AGENT_COMMAND[0], "args": list(AGENT_COMMAND[1:])},
            "tag": "ringfence-browser-agent",
        }
        payload = json.dumps(message).encode()
        # No deadline (no connect-timeout-ms, no timeoutMs): it lives as long as its sandbox.
        stream = await daemon.send(
            "POST",
            f"/{PROCESS}/Start",
            params={"username": SANDBOX_USER},
            headers={"content-type": "application/connect+json"},
            content=len(payload).to_bytes(5, "big") + payload,
        )
        if stream.status_code != 200:
            refusal = (await stream.aread())[:_MAX_OUTPUT].decode("utf-8", "replace")
            raise BrowserError(
                f"sandbox {daemon.sandbox_id}: its daemon would not start the browser agent "
                f"(HTTP {stream.status_code}: {_clip(refusal, 300)})"
            )
        ended = asyncio.create_task(_until_it_ends(stream))
        decode = functools.partial(_parsed, daemon, BrowserStatus, path="/health")
        try:
            async with asyncio.timeout(START_SECONDS):
                while True:
                    try:
                        await self._call(daemon, "GET", "/health", None, START_SECONDS, decode)
                    except PortNotListening:
                        done, _ = await asyncio.wait({ended}, timeout=_POLL_SECONDS)
                        if done:
                            raise BrowserError(
                                f"sandbox {daemon.sandbox_id}: its browser agent exited as it "
                                f"started: {ended.result()}"
                            ) from None
                        continue
                    return
        except TimeoutError:
            raise BrowserError(
                f"sandbox {daemon.sandbox_id}: its browser agent did not listen on port "
                f"{AGENT_PORT} within {START_SECONDS:g} s of its start"
            ) from None
        finally:
            ended.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ended
            await stream.aclose()  # the process stays: leaving its stream does not end it

    async def _call(
        self,
        daemon: DaemonClient,
        method: str,
        path: str,
        body: bytes | None,
        seconds: float,
        decode: Callable[[_Answer], _Decoded],
    ) -> _Decoded:
        """One HTTP/1.1 exchange with the agent over a tunnel of its own, bounded, and its
        answer decoded (``decode``, in a worker thread) while its bytes are held.

        Raises:
            PortNotListening: no agent listens.
            BrowserTimeout: no whole answer within ``seconds``.
            BrowserError: the answer is not HTTP, or is past the answer bound.
            ServerAtCapacity: no room under ``max_browser_buffered_bytes``.
        """
        held = _Held(self.buffered)
        try:
            pipe = await open_tunnel(daemon.socket_path, daemon.sandbox_id, AGENT_PORT)
            try:
                async with asyncio.timeout(seconds):
                    answer = await self._exchange(daemon, pipe, method, path, body, held)
            except TimeoutError:
                raise BrowserTimeout(
                    f"sandbox {daemon.sandbox_id}: its browser agent did not answer {path} "
                    f"within {seconds:g} s"
                ) from None
            finally:
                await pipe.aclose()
        except BaseException:
            held.give_back()
            raise
        # A thread cannot be cancelled: a caller that goes away leaves it decoding, and its
        # bytes are given back when it ends, not before.
        decoding = asyncio.ensure_future(asyncio.to_thread(decode, answer))
        decoding.add_done_callback(lambda done: _given_back(done, held))
        return await asyncio.shield(decoding)

    async def _exchange(
        self,
        daemon: DaemonClient,
        pipe: Pipe,
        method: str,
        path: str,
        body: bytes | None,
        held: _Held,
    ) -> _Answer:
        protocol = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
        headers = [("host", "127.0.0.1"), ("connection", "close")]
        if body is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
        data = protocol.send(h11.Request(method=method, target=path, headers=headers)) or b""
        if body:
            data += protocol.send(h11.Data(data=body)) or b""
        data += protocol.send(h11.EndOfMessage()) or b""
        try:
            pipe.writer.write(data)
            await pipe.writer.drain()
            status, limit, received = 0, _MAX_ERROR, bytearray()
            while True:
                event = protocol.next_event()
                if event is h11.NEED_DATA:
                    protocol.receive_data(await pipe.reader.read(_CHUNK))
                    continue
                if isinstance(event, h11.InformationalResponse):
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                    limit = self._max_result_bytes if status == 200 else _MAX_ERROR
                    length = _content_length(event.headers)
                    if length is not None and length > limit:
                        raise _past(daemon, path, limit, status)
                    if length:  # taken whole: answers never hold parts while they wait
                        await held.take(length)
                elif isinstance(event, h11.Data):
                    received += event.data
                    if len(received) > limit:
                        raise _past(daemon, path, limit, status)
                    if len(received) > held.size:  # no Content-Length: taken as it comes
                        await held.take(len(received) - held.size)
                elif isinstance(event, h11.EndOfMessage):
                    return _Answer(status, bytes(received))
                else:  # ConnectionClosed before the answer's end
                    raise _garbage(daemon, path, "it closed the connection mid-answer")
        except h11.RemoteProtocolError as exc:
            if pipe.reader.at_eof():  # the agent (or its sandbox) went away mid-call
                raise _garbage(daemon, path, "nothing: it closed the connection") from exc
            raise _garbage(daemon, path, f"not HTTP/1.1 ({exc})") from exc
        except (OSError, EOFError) as exc:
            raise _garbage(daemon, path, f"the connection broke ({exc})") from exc


def _given_back(decoding: asyncio.Future[Any], held: _Held) -> None:
    held.give_back()
    if not decoding.cancelled():
        decoding.exception()  # retrieved: the caller's await raised it, or nobody waits


class _Answer:
    __slots__ = ("body", "status")

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body


_Decoded = TypeVar("_Decoded")


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The head's ``Content-Length`` (h11 has checked it is one number), or None."""
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return None


def _past(daemon: DaemonClient, path: str, limit: int, status: int) -> BrowserError:
    return _garbage(
        daemon, path, f"an answer past {limit} bytes (the server's bound, "
        "max_browser_result_bytes)" if status == 200 else f"an error past {limit} bytes"
    )  # fmt: skip


def _parsed(daemon: DaemonClient, model: type[_Model], answer: _Answer, path: str) -> _Model:
    """The agent's 200 answer as ``model``, or its error raised as the table says (CPU
    work: called in a worker thread)."""
    fields = _json(daemon, answer, path)
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        problem = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'body'}: {error['msg']}"
            for error in exc.errors()[:3]
        )
        raise _garbage(daemon, path, f"JSON that is not a {model.__name__} ({problem})") from exc


def _json(daemon: DaemonClient, answer: _Answer, path: str) -> dict[str, object]:
    """The answer's JSON object if it is a 200; its error raised otherwise."""
    _check_structure(daemon, answer.body, path)
    try:  # NaN and Infinity are no JSON: the server could not send them on
        decoded = json.loads(answer.body, parse_constant=_no_constant, parse_float=_finite)
    except _NotFinite as exc:  # 1e400: a float, but not one JSON can carry on
        raise _garbage(daemon, path, f"a number that is not finite ({exc})") from None
    except (ValueError, UnicodeDecodeError):
        decoded = None
    except RecursionError:  # nesting past the parser's stack: never a 500
        raise _garbage(daemon, path, "JSON nested too deep") from None
    if answer.status != 200:
        raise _refusal(daemon, path, answer.status, decoded)
    if not isinstance(decoded, dict):
        raise _garbage(daemon, path, "what is not a JSON object")
    if _deeper_than(decoded, _MAX_DEPTH):  # what passes the parser may not be re-encoded
        raise _garbage(daemon, path, f"JSON nested deeper than {_MAX_DEPTH} levels")
    return decoded


def _check_structure(daemon: DaemonClient, body: bytes, path: str) -> None:
    """Refuse JSON of more containers or nodes than a real answer holds, counted before
    it is parsed, in C (``bytes.count``, ``find``, ``replace``: never a step per byte in
    Python or a regex): strings, however long, count one; what is not JSON is the
    parser's to refuse."""
    # The escapes that could hide a quote gone: pairs of backslashes, then \" (a run of
    # backslashes pairs from its start, as JSON reads it; valid JSON has none outside
    # strings). What is left of each string is a quote, no quote, a quote.
    plain = body.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in body else body
    if plain.count(b'"') // 2 > _MAX_NODES:
        raise _garbage(daemon, path, f"JSON of more than {_MAX_NODES} values")
    containers = nodes = at = 0
    while True:  # a gap between strings, then a string: at most _MAX_NODES rounds
        quote = plain.find(b'"', at)
        gap = len(plain) if quote < 0 else quote
        opened = plain.count(b"{", at, gap) + plain.count(b"[", at, gap)
        containers += opened
        nodes += opened + plain.count(b",", at, gap) + (quote >= 0)
        if containers > _MAX_CONTAINERS:
            raise _garbage(daemon, path, f"JSON of more than {_MAX_CONTAINERS} objects and arrays")
        if nodes > _MAX_NODES:
            raise _garbage(daemon, path, f"JSON of more than {_MAX_NODES} values")
        if quote < 0 or (close := plain.find(b'"', quote + 1)) < 0:
            return  # the end (or an unterminated string: the parser's)
        at = close + 1


class _NotFinite(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(_clip(text, 32))
    return value


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests containers more than ``limit`` deep (walked
    without recursion)."""
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def _refusal(daemon: DaemonClient, path: str, status: int, decoded: object) -> RingfenceError:
    error = decoded.get("error") if isinstance(decoded, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(code, str) or not isinstance(message, str):
        return _garbage(daemon, path, f"HTTP {status} without its error body")
    kind = _ERRORS.get(code, BrowserError)
    text = _clip(message, 2000)
    if kind is BrowserError and code != "browser_failed":
        text = f"{text} (its code: {_clip(code, 64)!r}, HTTP {status})"
    return kind(f"sandbox {daemon.sandbox_id}: the browser: {text}")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _garbage(daemon: DaemonClient, path: str, what: str) -> BrowserError:
    return BrowserError(
        f"sandbox {daemon.sandbox_id}: its browser agent answered {path} with {what}"
    )


async def _until_it_ends(stream: DaemonResponse) -> str:
    """Read a ``Start`` stream to its end: how the process ended and the tail of what it
    printed (bounded)."""
    buffer, output, ended = b"", b"", "its output stream ended"
    async for chunk in stream.aiter_raw():
        buffer += chunk
        while len(buffer) >= 5 and len(buffer) >= 5 + int.from_bytes(buffer[1:5], "big"):
            size = int.from_bytes(buffer[1:5], "big")
            frame, buffer = buffer[5 : 5 + size], buffer[5 + size :]
            output, ended = _event(frame, output, ended)
        if len(buffer) > 1 << 20:
            break
    text = output[-_MAX_OUTPUT:].decode("utf-8", "replace").strip()
    return f"{ended}{': ' + text if text else ''}"


def _event(frame: bytes, output: bytes, ended: str) -> tuple[bytes, str]:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        message: Mapping[str, object] = json.loads(frame)
        event = message.get("event")
        if isinstance(event, dict) and isinstance(event.get("data"), dict):
            for stream in ("stdout", "stderr"):
                value = event["data"].get(stream)
                if isinstance(value, str):
                    output = (output + base64.b64decode(value))[-_MAX_OUTPUT:]
        if isinstance(event, dict) and isinstance(event.get("end"), dict):
            end = event["end"]
            ended = f"it exited ({end.get('status') or end.get('exitCode')})"
        error = message.get("error")
        if isinstance(error, dict):
            ended = f"its start failed ({error.get('message')})"
    return output, ended
