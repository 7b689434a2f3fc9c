"""A small HTTP/1.1 server side: requests in, unary and chunked responses out.

Bounded everywhere: a request line or header line of at most 8 KiB, 64 KiB of headers,
chunk-size lines of 1 KiB. Bodies are read incrementally through ``Body`` (Content-Length or
chunked), never buffered whole unless the caller asks with a limit.
"""

from __future__ import annotations

__all__ = ["Body", "Closed", "Conn", "HttpError", "Request", "read_request"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _socket import socket

MAX_LINE = 8 * 1024
MAX_HEADERS = 64 * 1024
DRAIN_LIMIT = 1024 * 1024  # an unread body up to this size is skipped to keep the connection
_RECV = 64 * 1024

REASONS = {
    100: "Continue",
    101: "Switching Protocols",
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    499: "Client Closed Request",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
    507: "Insufficient Storage",
}


class Closed(Exception):
    """The peer closed the connection or broke the protocol mid-message: drop it."""


class HttpError(Exception):
    """A malformed request: answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Conn:
    """A socket with a read buffer."""

    def __init__(self, sock: socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self.body: Body | None = None  # of the request being answered
        self.close_after = False  # answer with "Connection: close", then close

    def finish_body(self) -> None:
        """Skip what is left of the request body, or plan to close if too much is left."""
        if self.body is not None and not self.close_after and not self.body.drain(DRAIN_LIMIT):
            self.close_after = True

    def _fill(self) -> None:
        try:
            data = self.sock.recv(_RECV)
        except OSError as exc:
            raise Closed(str(exc)) from None
        if not data:
            raise Closed("the peer closed the connection")
        self._buf += data

    def readline(self, limit: int) -> bytes:
        """One line without its CRLF; HttpError(431) past ``limit`` bytes."""
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end >= 0:
                if end > limit:
                    raise HttpError(431, "a request line or header line is too long")
                line = bytes(self._buf[:end])
                del self._buf[: end + 1]
                return line[:-1] if line.endswith(b"\r") else line
            if len(self._buf) > limit:
                raise HttpError(431, "a request line or header line is too long")
            start = len(self._buf)
            self._fill()

    def read_some(self, n: int) -> bytes:
        """Between 1 and ``n`` bytes; Closed at end of stream."""
        if not self._buf:
            self._fill()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def has_buffered(self) -> bool:
        return bool(self._buf)

    def take_buffered(self) -> bytes:
        """What was read beyond the request so far (for a connection that is upgraded)."""
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def peer_closed(self) -> bool:
        """Whether the peer closed or reset the connection; what it sent stays unread.

        For a socket that polls readable: the bytes may be a pipelined next request.
        """
        from _socket import MSG_DONTWAIT, MSG_PEEK

        try:
            return self.sock.recv(1, MSG_PEEK | MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise Closed(str(exc)) from None

    def respond(self, status: int, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        self.finish_body()
        head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
        head.extend(f"{name}: {value}" for name, value in headers)
        if self.close_after:
            head.append("Connection: close")
        if status != 204 and status >= 200:
            head.append(f"Content-Length: {len(body)}")
        self.send(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    def start_chunked(self, status: int, content_type: str) -> None:
        self.send(
            f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n"
            f"Content-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n"
            f"{'Connection: close' + chr(13) + chr(10) if self.close_after else ''}\r\n".encode()
        )

    def send_chunk(self, data: bytes) -> None:
        if data:
            self.send(b"%x\r\n%s\r\n" % (len(data), data))

    def end_chunked(self) -> None:
        self.send(b"0\r\n\r\n")


class Body:
    """A request body, read incrementally; ``read`` returns b"" at its end."""

    def __init__(self, conn: Conn, length: int | None, chunked: bool) -> None:
        self._conn = conn
        self._left = length or 0  # bytes left in the body, or in the current chunk
        self._chunked = chunked
        self.done = not chunked and not length

    def read(self, n: int = _RECV) -> bytes:
        if self.done:
            return b""
        if self._chunked and self._left == 0:
            self._next_chunk()
            if self.done:
                return b""
        data = self._conn.read_some(min(n, self._left))
        self._left -= len(data)
        if self._left == 0:
            if self._chunked:
                if self._conn.readline(2) != b"":
                    raise Closed("a chunk is not followed by CRLF")
            else:
                self.done = True
        return data

    def _next_chunk(self) -> None:
        line = self._conn.readline(1024).split(b";", 1)[0].strip()
        try:
            size = int(line, 16)
        except ValueError:
            raise Closed("a chunk size is not hexadecimal") from None
        if size < 0:
            raise Closed("a chunk size is negative")
        if size == 0:
            total = 0
            while True:  # trailers, ignored
                trailer = self._conn.readline(MAX_LINE)
                total += len(trailer)
                if not trailer:
                    break
                if total > MAX_HEADERS:
                    raise Closed("too many trailers")
            self.done = True
        self._left = size

    def read_all(self, limit: int) -> bytes | None:
        """The whole body, or None if it is longer than ``limit`` (the rest stays unread)."""
        parts: list[bytes] = []
        size = 0
        while True:
            data = self.read(min(_RECV, limit + 1 - size))
            if not data:
                return b"".join(parts)
            size += len(data)
            if size > limit:
                return None
            parts.append(data)

    def read_exact(self, n: int) -> bytes | None:
        """Exactly ``n`` bytes, or None if the body ends first."""
        parts: list[bytes] = []
        while n:
            data = self.read(n)
            if not data:
                return None
            parts.append(data)
            n -= len(data)
        return b"".join(parts)

    def drain(self, limit: int) -> bool:
        """Skip the rest of the body; False if more than ``limit`` bytes were left."""
        skipped = 0
        while not self.done:
            skipped += len(self.read())
            if skipped > limit:
                return False
        return True


class Request:
    def __init__(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: Body
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body


def read_request(conn: Conn) -> Request:
    """The next request's head; raise Closed at a clean end of the connection."""
    line = conn.readline(MAX_LINE)
    while not line:  # RFC 9112 2.2: ignore empty lines before a request line
        line = conn.readline(MAX_LINE)
    try:
        method, target, version = line.decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise HttpError(400, "the request line is malformed") from None
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, "only HTTP/1.1 is supported")
    headers: dict[str, str] = {}
    total = 0
    while True:
        raw = conn.readline(MAX_LINE)
        if not raw:
            break
        total += len(raw) + 2
        if total > MAX_HEADERS:
            raise HttpError(431, "the request headers are larger than 64 KiB")
        name, sep, value = raw.decode("latin-1").partition(":")
        name = name.lower()
        if not sep or not name or name != name.strip() or " " in name:
            raise HttpError(400, "a header line is malformed")
        value = value.strip(" \t")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    length: int | None = None
    chunked = False
    te = headers.get("transfer-encoding")
    if te is not None:
        if te.lower() != "chunked":
            raise HttpError(501, "only the chunked transfer coding is supported")
        if "content-length" in headers:
            raise HttpError(400, "a request cannot have both Content-Length and chunked coding")
        chunked = True
    elif "content-length" in headers:
        cl = headers["content-length"]
        if not cl.isdigit() or len(cl) > 18:
            raise HttpError(400, "Content-Length is not a number")
        length = int(cl)
    path, _, qs = target.partition("?")
    request = Request(method, path, parse_query(qs), headers, Body(conn, length, chunked))
    conn.body = request.body
    connection = headers.get("connection", "").lower()
    conn.close_after = "close" in connection or (
        version == "HTTP/1.0" and "keep-alive" not in connection
    )
    if headers.get("expect", "").lower() == "100-continue":
        conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")
    return request


def unquote(text: str) -> str:
    """Percent-decoding (and ``+`` as space) of one query-string component, as UTF-8."""
    if "%" not in text and "+" not in text:
        return text
    raw = text.replace("+", " ").encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(raw):
        byte = raw[i]
        if byte == 0x25 and i + 2 < len(raw) and _is_hex(raw[i + 1 : i + 3]):
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(byte)
            i += 1
    return out.decode("utf-8", "surrogateescape")


def _is_hex(pair: bytes) -> bool:
    return len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair)


def parse_query(qs: str) -> dict[str, str]:
    query: dict[str, str] = {}
    for part in qs.split("&"):
        if part:
            key, _, value = part.partition("=")
            query.setdefault(unquote(key), unquote(value))
    return query
