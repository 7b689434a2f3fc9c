"""Requests smuggled past the proxy's HTTP rules (security review of issue 14): a tunnel
whose request the classifier takes for another protocol, a pipelined second request, an
IPv6 zone id on one of Ringfence's own addresses. The proxy is served in process, with an
origin that reads everything it is sent and ignores ``Connection: close``."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ringfence.network import Requester, Resolver
from ringfence.network.http import BadRequest, body_length, parse_head, starts_request
from ringfence.network.intercept import Interceptor
from ringfence.network.proxy import serve_client
from ringfence.network.session import EgressSession
from ringfence.policy.egress import OwnEndpoints, canonical_address, own_endpoints
from ringfence.service.audit import AuditLog
from tests.network.test_egress import rules

_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class _Origin:
    port: int = 0
    received: bytearray = field(default_factory=bytearray)


@pytest.fixture
async def origin() -> AsyncIterator[_Origin]:
    """Answers once a head has arrived, then keeps reading until the proxy hangs up: what
    it got is everything the proxy ever sent it."""
    seen = _Origin()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while b"\r\n\r\n" not in seen.received and (chunk := await reader.read(65536)):
                seen.received += chunk
            writer.write(_ANSWER)
            writer.write_eof()
            while chunk := await reader.read(65536):
                seen.received += chunk
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    seen.port = server.sockets[0].getsockname()[1]
    async with server:
        yield seen


async def _through_proxy(audit: AuditLog, port: int, sent: bytes) -> bytes:
    """Everything the proxy answers to ``sent`` (allowed.test:port allowed, on loopback)."""
    session = EgressSession(
        Requester("acme", "execution:test", "key-1", audit),
        rules({"domain": "allowed.test", "cidr": "127.0.0.1/32", "ports": [port]}),
    )
    resolver = Resolver({"allowed.test": ["127.0.0.1"], "evil.test": ["127.0.0.1"]}, system=False)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_client(session, resolver, reader, writer, own=OwnEndpoints())

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.sockets[0].getsockname()[1]
        )
        writer.write(sent)
        answer = await asyncio.wait_for(reader.read(), 30)  # the proxy closes when done
        writer.close()
    return answer


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        b"\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        b" GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        b"\tGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        b"GET\t/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        b"GET\r/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    ],
    ids=["crlf", "two-crlf", "sp", "htab", "htab-after-method", "bare-cr-after-method"],
)
async def test_a_tunnelled_request_that_an_origin_may_parse_is_held_to_the_host_rule(
    origin: _Origin, audit: AuditLog, request_bytes: bytes
) -> None:
    connect = f"CONNECT allowed.test:{origin.port} HTTP/1.1\r\n\r\n".encode()
    answer = await _through_proxy(audit, origin.port, connect + request_bytes)
    refusal = answer.partition(b"\r\n\r\n")[2]
    assert refusal.startswith((b"HTTP/1.1 403 ", b"HTTP/1.1 400 ")), answer
    assert b"evil.test" not in origin.received, origin.received


async def test_leading_empty_lines_are_skipped_and_the_request_passes(
    origin: _Origin, audit: AuditLog
) -> None:
    connect = f"CONNECT allowed.test:{origin.port} HTTP/1.1\r\n\r\n".encode()
    answer = await _through_proxy(
        audit, origin.port, connect + b"\r\nGET /ok HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
    )
    assert answer.endswith(_ANSWER), "control: a well-formed request passes"
    assert origin.received.startswith(b"GET /ok HTTP/1.1\r\n"), origin.received


@pytest.mark.parametrize("tunnelled", [True, False], ids=["connect", "absolute-form"])
async def test_a_pipelined_second_request_never_reaches_the_origin(
    origin: _Origin, audit: AuditLog, tunnelled: bool
) -> None:
    second = b"GET /second HTTP/1.1\r\nHost: evil.test\r\n\r\n"
    if tunnelled:
        sent = f"CONNECT allowed.test:{origin.port} HTTP/1.1\r\n\r\n".encode() + (
            b"POST /first HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\n\r\nbody"
        )
    else:
        sent = (
            f"POST http://allowed.test:{origin.port}/first HTTP/1.1\r\n"
            "Content-Length: 4\r\n\r\nbody"
        ).encode()
    answer = await _through_proxy(audit, origin.port, sent + second)
    assert answer.endswith(_ANSWER), answer
    assert origin.received.startswith(b"POST /first HTTP/1.1\r\n"), origin.received
    assert origin.received.endswith(b"\r\n\r\nbody"), "the body, framed by Content-Length"
    assert b"/second" not in origin.received and b"evil.test" not in origin.received


@pytest.mark.parametrize("tunnelled", [True, False], ids=["connect", "absolute-form"])
async def test_a_chunked_request_is_refused(
    origin: _Origin, audit: AuditLog, tunnelled: bool
) -> None:
    chunked = b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    chunked += b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
    if tunnelled:
        sent = f"CONNECT allowed.test:{origin.port} HTTP/1.1\r\n\r\n".encode()
        sent += b"POST / HTTP/1.1\r\nHost: allowed.test\r\n" + chunked
    else:
        sent = f"POST http://allowed.test:{origin.port}/ HTTP/1.1\r\n".encode() + chunked
    answer = await _through_proxy(audit, origin.port, sent)
    assert b"HTTP/1.1 400 " in answer and b"Transfer-Encoding" in answer, answer
    assert origin.received == b""


def test_the_request_classifier_skips_empty_lines_and_flags_odd_whitespace() -> None:
    assert starts_request(b"\r\n\r\nGET / HTTP/1.1") is True
    assert starts_request(b"\r\n") is None, "undecided: a request may follow"
    for odd in (b" GET", b"\tGET", b"GET\t/", b"GET\x0b/", b"GET\x0c/", b"GET\r/"):
        assert starts_request(odd) is True, odd
    assert starts_request(b"GET\r") is None, "a bare CR or a CRLF: not known yet"
    assert starts_request(b"PING\r\n") is False, "a word alone on its line is no request"
    assert starts_request(b"*1\r\n$4\r\nPING\r\n") is False, "Redis (RESP) passes"


def test_a_request_body_is_framed_by_content_length_only() -> None:
    def head(*headers: str) -> bytes:
        return "\r\n".join(["POST / HTTP/1.1", "Host: a.test", *headers]).encode()

    assert body_length(parse_head(head(), ("a.test", 80))) == 0
    assert body_length(parse_head(head("Content-Length: 12"), ("a.test", 80))) == 12
    for bad in (
        ("Transfer-Encoding: chunked",),
        ("Content-Length: 4", "Transfer-Encoding: chunked"),
        ("Content-Length: 4", "Content-Length: 4"),
        ("Content-Length: -1",),
        ("Content-Length: 0x10",),
    ):
        with pytest.raises(BadRequest):
            body_length(parse_head(head(*bad), ("a.test", 80)))


def test_a_zone_id_does_not_hide_an_own_endpoint() -> None:
    own = own_endpoints([(ipaddress.ip_address("fd00::7"), 8080)])
    zoned = ipaddress.ip_address("fd00::7%eth0")
    assert own.holds(zoned, 8080)
    assert canonical_address(zoned) == ipaddress.ip_address("fd00::7")
    assert str(canonical_address(zoned)) == "fd00::7", "connections go to the unzoned address"


@pytest.mark.parametrize(
    "target", ["[fd00::7%eth0]:8080", "[fe80::1%25eth0]:80", "[fd00::7%]:8080"]
)
def test_a_zone_id_in_a_proxy_target_is_refused(target: str) -> None:
    with pytest.raises(BadRequest, match="bad authority"):
        parse_head(f"CONNECT {target} HTTP/1.1".encode())
    with pytest.raises(BadRequest, match="bad authority"):
        parse_head(f"GET http://{target}/ HTTP/1.1".encode())


async def test_a_pipelined_second_request_in_an_intercepted_tunnel_never_reaches_the_origin(
    audit: AuditLog, tls_files: tuple[Path, Path], tmp_path: Path
) -> None:
    received = bytearray()

    async def tls_origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while b"\r\n\r\n" not in received and (chunk := await reader.read(65536)):
                received.extend(chunk)
            writer.write(_ANSWER)
            await writer.drain()
        writer.close()

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*tls_files)
    origin = await asyncio.start_server(tls_origin, "127.0.0.1", 0, ssl=context)
    port = origin.sockets[0].getsockname()[1]
    interceptor = Interceptor(tmp_path, ssl.create_default_context(cafile=str(tls_files[0])))
    session = EgressSession(
        Requester("acme", "execution:test", "key-1", audit),
        rules(
            {
                "domain": "allowed.test",
                "cidr": "127.0.0.1/32",
                "ports": [port],
                "headers": {"X-Api-Key": "k"},
            }
        ),
    )
    resolver = Resolver({"allowed.test": ["127.0.0.1"]}, system=False)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_client(session, resolver, reader, writer, interceptor, own=OwnEndpoints())

    proxy = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with origin, proxy:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", proxy.sockets[0].getsockname()[1]
        )
        writer.write(f"CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        trusting = ssl.create_default_context(cadata=interceptor.ca_pem.decode())
        await writer.start_tls(trusting, server_hostname="allowed.test")
        writer.write(
            b"POST /first HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\n\r\nbody"
            b"GET /second HTTP/1.1\r\nHost: evil.test\r\n\r\n"
        )
        answer = b""
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    interceptor.close()
    assert answer.endswith(_ANSWER), answer
    assert received.startswith(b"POST /first HTTP/1.1\r\n") and b"X-Api-Key: k\r\n" in received
    assert received.endswith(b"\r\n\r\nbody"), received
    assert b"/second" not in received and b"evil.test" not in received
