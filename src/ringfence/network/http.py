"""The proxy's view of HTTP/1.x: a request head parsed, and one rebuilt for the origin.
Pure. Only what a forward proxy needs: the request line, the headers, the target."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "MAX_HEAD_BYTES",
    "BadRequest",
    "RequestHead",
    "body_length",
    "host_named",
    "origin_head",
    "parse_head",
    "response",
    "starts_request",
]

MAX_HEAD_BYTES = 64 * 1024
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_TOKEN_BYTES = frozenset(
    b"!#$%&'*+.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-"
)
_SEPARATORS = frozenset(b" \t\x0b\x0c")
_WHITESPACE = frozenset(bytes([b]) for b in _SEPARATORS)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but HTAB
# Hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own: never passed to the origin.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization",
     "proxy-authenticate", "te", "trailer", "upgrade"}
)  # fmt: skip


class BadRequest(ValueError):
    """The request head cannot be proxied (the message says why)."""


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    host: str  # where to connect
    port: int
    path: str  # origin-form target ("/x?y"); "" for CONNECT


def _split_authority(authority: str, default_port: int) -> tuple[str, int]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise BadRequest(f"bad authority {authority!r}")
        host, rest = authority[1:end], authority[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = authority.partition(":")
    # "%": an IPv6 zone id (fe80::1%eth0) names an interface; none is reached through here.
    if not host or any(c in host for c in "/@?#\\ %"):
        raise BadRequest(f"bad authority {authority!r}")
    if port_text == "":
        return host, default_port
    # isascii: "²".isdigit() is True, but int("²") raises.
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise BadRequest(f"bad port in {authority!r}")
    return host, int(port_text)


def starts_request(data: bytes) -> bool | None:
    """Whether the first bytes a client sent may begin an HTTP/1 request as some server
    reads it: True or False, or None while it cannot be told yet. Empty lines before it are
    skipped (RFC 9112 2.2: servers SHOULD, nginx does), and whitespace at the start or after
    a method (SP, HTAB, VT, FF, a bare CR: RFC 9112 3 lets a server split on any) counts as
    HTTP, so that ``parse_head`` refuses what a lenient origin would still parse."""
    data = data.lstrip(b"\r\n")
    if data[:1] in _WHITESPACE:
        return True
    for index, byte in enumerate(data):
        if byte in _TOKEN_BYTES:
            continue
        if byte == 0x0D:  # CRLF ends a line with no target (not a request); a bare CR splits
            return None if index + 1 == len(data) else data[index + 1] != 0x0A
        return byte in _SEPARATORS
    return None


def parse_head(data: bytes, authority: tuple[str, int] | None = None) -> RequestHead:
    """Parse a proxy request head (up to and excluding the blank line). With ``authority``
    (host, port), an origin-form request inside a tunnel to it (``GET /path``).

    Raises:
        BadRequest: not a request a forward proxy can pass on.
    """
    try:
        text = data.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest("undecodable head") from exc
    lines = text.split("\r\n")
    # A bare CR or LF ends a line for some servers and not for others: through it, a second
    # request would ride inside this one (and get a rule's headers).
    if any("\r" in line or "\n" in line for line in lines):
        raise BadRequest("bare CR or LF in the request head")
    if _CONTROL.search(lines[0]):
        raise BadRequest(f"control character in the request line {lines[0][:200]!r}")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(f"bad request line {lines[0][:200]!r}")
    method, target, version = parts
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name):
            raise BadRequest(f"bad header line {line[:200]!r}")
        if _CONTROL.search(value):
            raise BadRequest(f"control character in the value of header {name!r}")
        headers.append((name, value.strip()))
    if authority is not None:
        if not target.startswith("/"):
            raise BadRequest("inside a tunnel, requests are origin-form (GET /path)")
        return RequestHead(method, target, version, tuple(headers), *authority, target)
    if method == "CONNECT":
        host, port = _split_authority(target, 443)
        return RequestHead(method, target, version, tuple(headers), host, port, "")
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        raise BadRequest(
            "only http:// URLs (absolute form) and CONNECT go through this proxy; "
            "for https, use CONNECT (HTTPS_PROXY does)"
        )
    url_authority, slash, path = rest.partition("/")
    if "@" in url_authority:
        raise BadRequest("credentials in the URL are not passed on")
    host, port = _split_authority(url_authority, 80)
    return RequestHead(method, target, version, tuple(headers), host, port, slash + path)


def host_named(head: RequestHead) -> str | None:
    """The host name the ``Host`` header names (lower case, no port), or None without one.

    Raises:
        BadRequest: several ``Host`` headers, or one that is not an authority.
    """
    values = [value for name, value in head.headers if name.lower() == "host"]
    if len(values) > 1:
        raise BadRequest("several Host headers")
    if not values:
        return None
    name = _split_authority(values[0], 80)[0]
    return name.strip().lower().removesuffix(".")


def body_length(head: RequestHead) -> int:
    """How many bytes of body follow the head: its ``Content-Length`` (0 without one). The
    proxy passes exactly these on and nothing after them, so a second request never rides
    along unchecked.

    Raises:
        BadRequest: ``Transfer-Encoding`` (its framing is not followed: send Content-Length),
            several ``Content-Length`` headers, or one that is not a number.
    """
    if any(name.lower() == "transfer-encoding" for name, _ in head.headers):
        raise BadRequest("Transfer-Encoding in a request is not passed on; send Content-Length")
    values = [value for name, value in head.headers if name.lower() == "content-length"]
    if len(values) > 1:
        raise BadRequest("several Content-Length headers")
    if not values:
        return 0
    if not (values[0].isascii() and values[0].isdigit()):
        raise BadRequest(f"bad Content-Length {values[0][:50]!r}")
    return int(values[0])


def origin_head(head: RequestHead, extra: Mapping[str, str]) -> bytes:
    """The head to send to the origin: origin-form target, hop-by-hop headers removed,
    ``extra`` headers set (replacing any of the same name), one request per connection.
    ``Host`` is always the URL's: the decision was made on it, so no other name may ride
    along to a server that hosts several."""
    replaced = {name.lower() for name in extra} | {"host"}
    lines = [f"{head.method} {head.path or '/'} HTTP/1.1"]
    for name, value in head.headers:
        lowered = name.lower()
        if lowered in _HOP_BY_HOP or lowered in replaced:
            continue
        lines.append(f"{name}: {value}")
    host = f"[{head.host}]" if ":" in head.host else head.host
    lines.append(f"Host: {host}" + ("" if head.port in (80, 443) else f":{head.port}"))
    lines += [f"{name}: {value}" for name, value in extra.items()]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def response(status: int, reason: str, body: str = "") -> bytes:
    """A complete response from the proxy itself; ``reason`` is made safe for a status line
    (clients show it: "Tunnel connection failed: 403 ...")."""
    safe = "".join(c if 32 <= ord(c) < 127 else "?" for c in reason)[:300]
    payload = body.encode()
    return (
        f"HTTP/1.1 {status} {safe}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n"
        f"Ringfence-Egress: refused\r\n\r\n"
    ).encode() + payload
