"""The proxy's parsers: TLS ClientHello (real ones, made by the ssl module), DNS messages
and HTTP proxy request heads."""

from __future__ import annotations

import ipaddress
import ssl
import struct

import pytest

from ringfence.network import dns
from ringfence.network.http import BadRequest, origin_head, parse_head, response
from ringfence.network.sni import HelloState, parse_client_hello


def client_hello(server_name: str | None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = server_name is not None
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_the_server_name_of_a_real_client_hello() -> None:
    hello = client_hello("pypi.org")
    assert parse_client_hello(hello).server_name == "pypi.org"
    assert parse_client_hello(hello).state is HelloState.PARSED


def test_a_hello_without_a_server_name() -> None:
    parsed = parse_client_hello(client_hello(None))
    assert parsed.state is HelloState.PARSED and parsed.server_name is None


def test_a_partial_hello_needs_more_at_every_cut() -> None:
    hello = client_hello("files.pythonhosted.org")
    for cut in range(len(hello)):
        assert parse_client_hello(hello[:cut]).state is HelloState.NEED_MORE, cut


def test_a_hello_split_over_two_records() -> None:
    hello = client_hello("pypi.org")
    body = hello[5:]
    half = len(body) // 2
    split = b"".join(
        b"\x16\x03\x01" + struct.pack("!H", len(part)) + part for part in (body[:half], body[half:])
    )
    assert parse_client_hello(split).server_name == "pypi.org"


@pytest.mark.parametrize("data", [b"GET / HTTP/1.1\r\n", b"SSH-2.0-OpenSSH\r\n", b"\x00\x01"])
def test_other_protocols_are_not_tls(data: bytes) -> None:
    assert parse_client_hello(data).state is HelloState.NOT_TLS


def test_malformed_hellos() -> None:
    hello = bytearray(client_hello("pypi.org"))
    assert parse_client_hello(b"\x16\x02\x00\x00\x05hello").state is HelloState.MALFORMED
    not_hello = bytes(hello[:5]) + b"\x02" + bytes(hello[6:])  # a ServerHello type
    assert parse_client_hello(not_hello).state is HelloState.MALFORMED
    truncated = bytes(hello[:5]) + bytes(hello[5:9]) + b"\x03\x03"  # claims more than it has
    record = b"\x16\x03\x01" + struct.pack("!H", len(truncated) - 5) + truncated[5:]
    assert parse_client_hello(record).state in (HelloState.MALFORMED, HelloState.NEED_MORE)
    assert parse_client_hello(b"\x16\x03\x01\x00\x00").state is HelloState.MALFORMED


def test_an_endless_hello_is_malformed_not_awaited_forever() -> None:
    record = b"\x16\x03\x01\x40\x00" + b"\x01\xff\xff\xff" + b"\x00" * 0x3FFC
    assert parse_client_hello(record * 5).state is HelloState.MALFORMED


# -- DNS ---------------------------------------------------------------------------------------


def query(name: str, qtype: int = dns.TYPE_A, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + struct.pack("!HH", qtype, 1)


def test_a_query_parses_and_is_answered() -> None:
    question = dns.parse_query(query("Allowed.Test"))
    assert question is not None
    assert (question.name, question.qtype, question.id) == ("allowed.test", dns.TYPE_A, 0x1234)
    reply = dns.answer(question, dns.NOERROR, [ipaddress.IPv4Address("127.0.0.1")])
    ident, flags, qd, an = struct.unpack("!HHHH", reply[:8])
    assert (ident, flags & 0x8000, flags & 0xF, qd, an) == (0x1234, 0x8000, 0, 1, 1)
    assert reply.endswith(bytes([127, 0, 0, 1]))


def test_nxdomain() -> None:
    question = dns.parse_query(query("denied.test"))
    assert question is not None
    reply = dns.answer(question, dns.NXDOMAIN)
    assert struct.unpack("!H", reply[2:4])[0] & 0xF == dns.NXDOMAIN
    assert struct.unpack("!H", reply[6:8])[0] == 0


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00" * 11,
        struct.pack("!HHHHHH", 1, 0x8100, 1, 0, 0, 0) + b"\x00\x00\x01\x00\x01",  # a response
        struct.pack("!HHHHHH", 1, 0x0100, 2, 0, 0, 0) + b"\x00\x00\x01\x00\x01",  # 2 questions
        struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c\x00\x01\x00\x01",  # pointer
        struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x05abc",  # cut short
    ],
)
def test_bad_queries_are_not_questions(data: bytes) -> None:
    assert dns.parse_query(data) is None


def test_format_error_echoes_the_id() -> None:
    reply = dns.format_error(struct.pack("!HHHHHH", 7, 0x0100, 2, 0, 0, 0))
    assert reply is not None and reply[:2] == b"\x00\x07"
    assert dns.format_error(b"\x00") is None


# -- HTTP --------------------------------------------------------------------------------------


def test_connect_heads() -> None:
    head = parse_head(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443")
    assert (head.method, head.host, head.port) == ("CONNECT", "pypi.org", 443)
    assert parse_head(b"CONNECT [2001:db8::1]:8443 HTTP/1.1").host == "2001:db8::1"


def test_plain_http_heads_and_what_the_origin_gets() -> None:
    head = parse_head(
        b"GET http://svc.test:8080/a?b=1 HTTP/1.1\r\nHost: other.test\r\n"
        b"Proxy-Authorization: x\r\nAuthorization: mine\r\nAccept: */*"
    )
    assert (head.host, head.port, head.path) == ("svc.test", 8080, "/a?b=1")
    sent = origin_head(head, {"Authorization": "Bearer injected"}).decode()
    lines = sent.split("\r\n")
    assert lines[0] == "GET /a?b=1 HTTP/1.1"
    assert "Host: svc.test:8080" in lines and "Host: other.test" not in lines
    assert "Authorization: Bearer injected" in lines and "Authorization: mine" not in lines
    assert not any(line.lower().startswith("proxy-") for line in lines)
    assert "Connection: close" in lines and sent.endswith("\r\n\r\n")


@pytest.mark.parametrize(
    "raw",
    [
        b"GET https://pypi.org/ HTTP/1.1",
        b"GET /relative HTTP/1.1",
        b"GET http://user:pw@svc.test/ HTTP/1.1",
        b"CONNECT pypi.org:0 HTTP/1.1",
        b"CONNECT pypi.org:http HTTP/1.1",
        b"CONNECT pypi.org:4\xb2 HTTP/1.1",  # '4²': isdigit(), but not a number int() reads
        b"GET http://svc.test:8\xb9/ HTTP/1.1",
        b"CONNECT :443 HTTP/1.1",
        b"GET http://svc.test/ HTTP/2",
        b"GET  http://svc.test/ HTTP/1.1",
        b"GET http://svc.test/ HTTP/1.1\r\nbad header",
        # A bare LF or CR, or another control character, in the head (request smuggling).
        b"GET http://svc.test/ HTTP/1.1\r\nX: 1\n\nGET /second HTTP/1.1\nHost: h",
        b"GET http://svc.test/ HTTP/1.1\r\nX: 1\r\rGET /second HTTP/1.1",
        b"GET http://svc.test/a\n\nGET/b HTTP/1.1",
        b"GET http://svc.test/a\rb HTTP/1.1",
        b"GET http://svc.test/a\x00b HTTP/1.1",
        b"GET http://svc.test/ HTTP/1.1\nX: 1",
        b"GET http://svc.test/ HTTP/1.1\r\nX: a\x7fb",
        b"GET http://svc.test/ HTTP/1.1\r\nX: a\x0bb",
        b"GET http://svc.test/ HTTP/1.1\r\nX: a\x00",
        b"CONNECT svc.test:443\n HTTP/1.1",
    ],
)
def test_heads_a_proxy_cannot_pass_on(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_head(raw)


def test_a_tab_in_a_header_value_is_kept() -> None:
    head = parse_head(b"GET http://svc.test/ HTTP/1.1\r\nX-A: a\tb")
    assert head.headers == (("X-A", "a\tb"),)


def test_refusals_say_why_on_the_status_line() -> None:
    refusal = response(403, "egress denied by Ringfence: no rule allows x:1\r\nInjected: 1")
    status = refusal.split(b"\r\n")[0]
    assert status.startswith(b"HTTP/1.1 403 egress denied by Ringfence: no rule allows x:1")
    head_lines = refusal.split(b"\r\n\r\n")[0].split(b"\r\n")
    assert not any(line.startswith(b"Injected") for line in head_lines)
