"""The server name (SNI) of a TLS ClientHello: a pure parser of the first bytes a client
sends through a CONNECT tunnel. It never decrypts anything; it reads the plaintext hello."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["MAX_HELLO_BYTES", "Hello", "HelloState", "parse_client_hello"]

MAX_HELLO_BYTES = 64 * 1024  # more than any real ClientHello; past it the tunnel is refused
_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_SERVER_NAME = 0x0000
_HOST_NAME = 0x00


class HelloState(Enum):
    NEED_MORE = "need more bytes"
    NOT_TLS = "not TLS"
    MALFORMED = "a malformed TLS ClientHello"
    PARSED = "parsed"


@dataclass(frozen=True)
class Hello:
    state: HelloState
    server_name: str | None = None


class _Short(Exception):
    pass


class _Bad(Exception):
    pass


def parse_client_hello(data: bytes) -> Hello:
    """What ``data`` (the client's first bytes) says: need more, not TLS, or the hello's
    server name (None when it names none)."""
    if not data:
        return Hello(HelloState.NEED_MORE)
    if data[0] != _HANDSHAKE:
        return Hello(HelloState.NOT_TLS)
    try:
        handshake = _handshake_bytes(data)
        return Hello(HelloState.PARSED, _server_name(handshake))
    except _Short:
        if len(data) >= MAX_HELLO_BYTES:
            return Hello(HelloState.MALFORMED)
        return Hello(HelloState.NEED_MORE)
    except _Bad:
        return Hello(HelloState.MALFORMED)


def _handshake_bytes(data: bytes) -> bytes:
    """The ClientHello message, gathered from as many handshake records as it spans."""
    message = bytearray()
    offset = 0
    while True:
        if len(data) < offset + 5:
            raise _Short
        if data[offset] != _HANDSHAKE or data[offset + 1] != 3:
            raise _Bad
        length = int.from_bytes(data[offset + 3 : offset + 5], "big")
        if length == 0 or length > 1 << 14:
            raise _Bad
        if len(data) < offset + 5 + length:
            raise _Short
        message += data[offset + 5 : offset + 5 + length]
        offset += 5 + length
        if len(message) >= 4:
            if message[0] != _CLIENT_HELLO:
                raise _Bad
            needed = 4 + int.from_bytes(message[1:4], "big")
            if len(message) >= needed:
                return bytes(message[4:needed])


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise _Bad
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))


def _server_name(hello: bytes) -> str | None:
    reader = _Reader(hello)
    reader.take(2 + 32)  # version, random
    reader.vector(1)  # session id
    reader.vector(2)  # cipher suites
    reader.vector(1)  # compression methods
    if reader.at == len(hello):
        return None  # no extensions at all
    extensions = _Reader(reader.vector(2))
    names: list[str] = []
    while extensions.at < len(extensions.data):
        kind = extensions.number(2)
        body = extensions.vector(2)
        if kind != _SERVER_NAME:
            continue
        if names:
            raise _Bad  # two server_name extensions: refuse rather than pick one
        entries = _Reader(body)
        listed = _Reader(entries.vector(2))
        while listed.at < len(listed.data):
            name_type = listed.number(1)
            name = listed.vector(2)
            if name_type == _HOST_NAME:
                try:
                    names.append(name.decode("ascii"))
                except UnicodeDecodeError:
                    raise _Bad from None
        if len(names) != 1:
            raise _Bad
    return names[0] if names else None
