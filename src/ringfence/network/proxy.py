"""The host-side proxy: one client connection from inside a sandbox, decided, audited,
and (if allowed) passed through.

Two kinds of request: ``CONNECT host:port`` (a tunnel; if the client speaks TLS, the server
name in its ClientHello must be the CONNECT host, or the tunnel is closed before a byte
reaches the origin) and plain HTTP in absolute form (``GET http://host/path``), which the
proxy re-sends to the origin with the rule's headers. A refusal is an immediate HTTP error
whose status line says why; nothing waits on a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ringfence.models import EgressAction
from ringfence.network.http import (
    MAX_HEAD_BYTES,
    BadRequest,
    RequestHead,
    body_length,
    host_named,
    origin_head,
    parse_head,
    response,
    starts_request,
)
from ringfence.network.intercept import Interceptor, TlsStream
from ringfence.network.resolver import Resolver, ResolverBusy
from ringfence.network.session import EgressSession
from ringfence.network.sni import HelloState, parse_client_hello
from ringfence.policy.egress import (
    OwnEndpoints,
    Verdict,
    check_addresses,
    decide,
    normalize_host,
)

__all__ = ["serve_client"]

log = logging.getLogger(__name__)

_HEAD_SECONDS = 30.0
_CONNECT_SECONDS = 10.0
_HELLO_SECONDS = 30.0
_CHUNK = 64 * 1024
# A plaintext TLS alert record: fatal (2), access_denied (49). Clients report it as
# "tlsv1 alert access denied".
_ACCESS_DENIED_ALERT = bytes([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 49])


@dataclass
class _Attempt:
    method: str = ""
    host: str = ""
    port: int = 0
    sent: int = 0  # bytes from the sandbox to the origin
    received: int = 0  # bytes from the origin to the sandbox
    started: float = field(default_factory=time.monotonic)
    server_name: str | None = None
    tunnelled: bool = False  # the client was told 200: an HTTP refusal cannot follow
    hello_refused: bool = False  # its ClientHello was refused: answer with a TLS alert

    def details(self, reason: str) -> dict[str, object]:
        return {
            "host": self.host, "port": self.port, "method": self.method, "reason": reason,
            "bytes_sent": self.sent, "bytes_received": self.received,
            "duration_ms": round((time.monotonic() - self.started) * 1000, 3),
            **({"sni": self.server_name} if self.server_name is not None else {}),
        }  # fmt: skip


class _Refused(Exception):
    def __init__(self, status: int, reason: str, outcome: str = "denied") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.outcome = outcome


async def serve_client(
    session: EgressSession,
    resolver: Resolver,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    interceptor: Interceptor | None = None,
    *,
    own: OwnEndpoints,
) -> None:
    """Serve one connection from the sandbox; every attempt ends on the audit record.
    With ``interceptor``, TLS tunnels whose rule adds headers are opened to add them.
    ``own``: Ringfence's endpoints, never connected to."""
    attempt = _Attempt()
    upstream: asyncio.StreamWriter | None = None
    try:
        head = await _read_head(reader)
        attempt.method, attempt.host, attempt.port = head.method, head.host, head.port
        # None: all the client sends goes on; else this request's body, and nothing after.
        body = None if head.method == "CONNECT" else _body_length(head)
        verdict = await _decide(session, resolver, head, own)
        assert verdict.addresses
        up_reader, upstream = await _open(verdict, head.port)
        if head.method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            attempt.tunnelled = True
            first = await _first_bytes(reader, up_reader, writer, head, attempt)
            rule = verdict.rule
            if interceptor is not None and rule is not None and rule.headers and _is_tls(first):
                await _intercepted(interceptor, head, rule.headers, (reader, writer),
                                   (up_reader, upstream), first, attempt)  # fmt: skip
                session.record("network.connect", "allowed", attempt.details(verdict.reason))
                return
            if first and not _is_tls(first):
                headers = rule.headers if rule is not None else {}
                first, body = await _tunnelled_request(reader, head, first, headers, attempt)
        else:
            extra = verdict.rule.headers if verdict.rule is not None else {}
            first = origin_head(head, extra)
        if first:
            upstream.write(first)
            attempt.sent += len(first)
        await _relay(reader, writer, up_reader, upstream, attempt, body)
        session.record("network.connect", "allowed", attempt.details(verdict.reason))
    except _Refused as refused:
        session.record("network.connect", refused.outcome, attempt.details(refused.reason))
        if not writer.is_closing():
            with contextlib.suppress(ConnectionError):
                if not attempt.tunnelled:
                    writer.write(response(refused.status, refused.reason, refused.reason + "\n"))
                elif attempt.hello_refused:
                    # Past the 200 the client speaks TLS: tell it in TLS ("access denied").
                    writer.write(_ACCESS_DENIED_ALERT)
                await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        session.record("network.connect", "failed", attempt.details(f"connection lost: {exc}"))
    except Exception as exc:  # a bug must not become an unhandled task error, nor go unaudited
        log.exception("egress proxy: unexpected error serving %s:%s", attempt.host, attempt.port)
        session.record(
            "network.connect", "failed", attempt.details(f"internal error: {type(exc).__name__}")
        )
    finally:
        for stream in (upstream, writer):
            if stream is not None:
                stream.close()


async def _read_head(reader: asyncio.StreamReader) -> RequestHead:
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_SECONDS)
    except asyncio.LimitOverrunError:
        raise _Refused(431, "request head too large") from None
    except (TimeoutError, asyncio.IncompleteReadError):
        raise _Refused(408, "no complete request head") from None
    if len(raw) > MAX_HEAD_BYTES:
        raise _Refused(431, "request head too large")
    try:
        head = parse_head(raw[:-4])
    except BadRequest as exc:
        raise _Refused(400, f"egress refused: {exc}") from None
    return head


def _body_length(request: RequestHead) -> int:
    try:
        return body_length(request)
    except BadRequest as exc:
        raise _Refused(400, f"egress refused: {exc}") from None


async def _decide(
    session: EgressSession, resolver: Resolver, head: RequestHead, own: OwnEndpoints
) -> Verdict:
    policy = session.policy
    host = normalize_host(head.host)
    verdict = decide(policy, host, head.port)
    if verdict.action is EgressAction.ASK:
        verdict = await session.settle(verdict, host, head.port)
    if verdict.action is EgressAction.DENY:
        raise _Refused(403, f"egress denied by Ringfence: {verdict.reason}")
    try:
        addresses = await resolver.resolve(host, session)
    except ResolverBusy:
        raise _Refused(
            503, "egress refused: too many name lookups in flight for this sandbox", "failed"
        ) from None
    checked = check_addresses(policy, verdict, host, head.port, addresses, own=own)
    if checked.action is EgressAction.DENY:
        raise _Refused(403, f"egress denied by Ringfence: {checked.reason}")
    return checked


async def _open(verdict: Verdict, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    last: Exception | None = None
    for address in verdict.addresses:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(str(address), port, limit=_CHUNK), _CONNECT_SECONDS
            )
        except (OSError, TimeoutError) as exc:
            last = exc
    raise _Refused(502, f"egress allowed, but the destination did not answer: {last}", "failed")


async def _first_bytes(
    client: asyncio.StreamReader,
    origin: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    head: RequestHead,
    attempt: _Attempt,
) -> bytes:
    """The client's first bytes through a tunnel, once they pass the SNI check. If the
    origin speaks first (a server-first protocol, so not TLS), nothing is checked: its
    bytes go to the client and b"" comes back."""
    data = bytearray()
    deadline = time.monotonic() + _HELLO_SECONDS
    origin_read = asyncio.ensure_future(origin.read(_CHUNK))
    try:
        while True:
            hello = parse_client_hello(bytes(data))
            if hello.state is HelloState.NOT_TLS:
                return bytes(data)
            if hello.state is HelloState.MALFORMED:
                attempt.hello_refused = True
                raise _Refused(403, "egress denied by Ringfence: a malformed TLS ClientHello")
            if hello.state is HelloState.PARSED:
                _check_server_name(hello.server_name, head, attempt)
                return bytes(data)
            reading = asyncio.ensure_future(client.read(_CHUNK))
            done, _ = await asyncio.wait(
                {reading, origin_read},
                timeout=max(deadline - time.monotonic(), 0),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if reading not in done:
                reading.cancel()  # StreamReader.read is cancellation-safe: nothing is lost
                if origin_read in done and not data:
                    return b""  # the finally passes the origin's bytes on
                raise _Refused(408, "egress refused: no complete TLS ClientHello")
            chunk = reading.result()
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(data), None)
            data += chunk
    finally:
        if origin_read.done() and not origin_read.cancelled() and not origin_read.exception():
            spoken = origin_read.result()
            attempt.received += len(spoken)
            client_writer.write(spoken)
        origin_read.cancel()


def _check_server_name(server_name: str | None, head: RequestHead, attempt: _Attempt) -> None:
    attempt.server_name = server_name
    host = normalize_host(head.host)
    if server_name is None:
        return  # no name claimed: the tunnel goes only where CONNECT said
    if normalize_host(server_name) != host:
        attempt.hello_refused = True
        raise _Refused(
            403,
            f"egress denied by Ringfence: TLS server name {server_name!r} is not the "
            f"CONNECT host {host!r}",
        )


async def _tunnelled_request(
    reader: asyncio.StreamReader,
    head: RequestHead,
    first: bytes,
    headers: Mapping[str, str],
    attempt: _Attempt,
) -> tuple[bytes, int | None]:
    """What goes first to the origin of a plaintext tunnel, and how many more bytes of the
    client's may follow (None: all). Plain HTTP in it is held to the rules of proxied HTTP:
    its ``Host`` is the CONNECT host (a server hosting several names never sees another:
    one naming another is refused), the rule's headers are added, the origin is told
    ``Connection: close``, and only this one request goes (RFC 9112 9.6; a pipelined second
    one, unchecked, never does). Other protocols pass as they are."""
    data = first
    # Empty lines before a request are skipped by servers (RFC 9112 2.2): here too.
    while (http := starts_request(data)) is None or (
        http and b"\r\n\r\n" not in data.lstrip(b"\r\n")
    ):
        if http:
            attempt.tunnelled = False  # it speaks HTTP: a refusal in HTTP reaches it
        if len(data) > MAX_HEAD_BYTES:
            raise _Refused(431, "request head too large")
        try:
            chunk = await asyncio.wait_for(reader.read(_CHUNK), _HEAD_SECONDS)
        except TimeoutError:
            raise _Refused(408, "no complete request head") from None
        if not chunk:
            raise asyncio.IncompleteReadError(data, None)
        data += chunk
    if not http:
        return data, None
    attempt.tunnelled = False
    raw, rest = data.lstrip(b"\r\n").split(b"\r\n\r\n", 1)
    if len(raw) > MAX_HEAD_BYTES:
        raise _Refused(431, "request head too large")
    host = normalize_host(head.host)
    try:
        request = parse_head(raw, (host, head.port))
        named = host_named(request)
    except BadRequest as exc:
        raise _Refused(400, f"egress refused: {exc}") from None
    attempt.method = f"CONNECT+{request.method}"
    if named is not None and named != host:
        raise _Refused(
            403, f"egress denied by Ringfence: Host {named!r} is not the CONNECT host {host!r}"
        )
    body = _body_length(request)
    return origin_head(request, headers) + rest[:body], body - len(rest[:body])


def _is_tls(first: bytes) -> bool:
    return parse_client_hello(first).state is HelloState.PARSED


async def _intercepted(
    interceptor: Interceptor,
    head: RequestHead,
    headers: Mapping[str, str],
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    origin: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    hello: bytes,
    attempt: _Attempt,
) -> None:
    """Open the client's TLS with Ringfence's CA and the origin's with the host's trust,
    add ``headers`` to the request, relay the rest. One request per tunnel: the origin is
    told ``Connection: close``, and clients open another tunnel for the next."""
    host = normalize_host(head.host)
    tls = TlsStream(interceptor.server_context(host), client[0], client[1], hello)
    try:
        await asyncio.wait_for(tls.handshake(), _HELLO_SECONDS)
    except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
        raise _Refused(403, f"TLS with the sandbox failed (is Ringfence's CA trusted?): {exc}",
                       "failed") from None  # fmt: skip
    try:
        await asyncio.wait_for(
            origin[1].start_tls(interceptor.upstream, server_hostname=host), _CONNECT_SECONDS
        )
    except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
        await _tls_refusal(tls, 502, f"the origin's TLS failed: {exc}")
        raise _Refused(
            502, f"egress allowed, but the origin's TLS failed: {exc}", "failed"
        ) from None
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = await asyncio.wait_for(tls.read(), _HEAD_SECONDS)
        if not chunk:
            raise asyncio.IncompleteReadError(buffer, None)
        buffer += chunk
        if len(buffer) > MAX_HEAD_BYTES:
            await _tls_refusal(tls, 431, "request head too large")
            raise _Refused(431, "request head too large")
    raw, rest = buffer.split(b"\r\n\r\n", 1)
    try:
        request = parse_head(raw, (host, head.port))
    except BadRequest as exc:
        await _tls_refusal(tls, 400, f"egress refused: {exc}")
        raise _Refused(400, f"egress refused: {exc}") from None
    try:
        left = body_length(request)
    except BadRequest as exc:
        await _tls_refusal(tls, 400, f"egress refused: {exc}")
        raise _Refused(400, f"egress refused: {exc}") from None
    sent = origin_head(request, headers) + rest[:left]
    left -= len(rest[:left])
    origin[1].write(sent)
    attempt.sent += len(sent)
    attempt.method = f"CONNECT+{request.method}"

    async def up() -> None:  # the rest of this request's body, and nothing after it
        nonlocal left
        while left and (chunk := (await tls.read())[:left]):
            left -= len(chunk)
            attempt.sent += len(chunk)
            origin[1].write(chunk)
            await origin[1].drain()

    upward = asyncio.ensure_future(up())
    try:
        while chunk := await origin[0].read(_CHUNK):
            attempt.received += len(chunk)
            await tls.write(chunk)
    finally:
        upward.cancel()


async def _tls_refusal(tls: TlsStream, status: int, reason: str) -> None:
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        await tls.write(response(status, reason, reason + "\n"))


async def _relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    origin_reader: asyncio.StreamReader,
    origin_writer: asyncio.StreamWriter,
    attempt: _Attempt,
    body: int | None,
) -> None:
    """Relay both ways; with ``body`` (an HTTP request was sent), only that many more bytes
    go up: the rest of the request's body. The origin is not told of the end (a half-close
    makes some servers drop the request): it closes after its answer, as asked."""

    async def pipe(
        src: asyncio.StreamReader, dst: asyncio.StreamWriter, upward: bool, left: int | None
    ) -> None:
        try:
            while left != 0:
                chunk = await src.read(_CHUNK if left is None else min(left, _CHUNK))
                if not chunk:
                    break
                if left is not None:
                    left -= len(chunk)
                if upward:
                    attempt.sent += len(chunk)
                else:
                    attempt.received += len(chunk)
                dst.write(chunk)
                await dst.drain()
            if left is None and dst.can_write_eof():
                dst.write_eof()
        except (ConnectionError, OSError):
            dst.close()

    up = asyncio.ensure_future(pipe(client_reader, origin_writer, True, body))
    down = asyncio.ensure_future(pipe(origin_reader, client_writer, False, None))
    try:
        await down  # the origin is done (or gone): the exchange is over
        await asyncio.wait({up}, timeout=1.0)
    finally:
        up.cancel()
        down.cancel()
