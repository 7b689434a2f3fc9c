"""DNS messages, as far as Ringfence's resolver needs them: parse one question, build the
answer. Pure; the server that uses them is in ``gateway.py``."""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "NOERROR",
    "NXDOMAIN",
    "SERVFAIL",
    "TYPE_A",
    "TYPE_AAAA",
    "Question",
    "answer",
    "parse_query",
]

TYPE_A = 1
TYPE_AAAA = 28
_CLASS_IN = 1
NOERROR = 0
_FORMERR = 1
SERVFAIL = 2
NXDOMAIN = 3
_TTL = 30
_MAX_LABELS = 127


@dataclass(frozen=True)
class Question:
    id: int
    flags: int
    name: str  # lower case, no trailing dot
    qtype: int
    qclass: int
    raw: bytes  # the question section as received, echoed in the answer


def parse_query(data: bytes) -> Question | None:
    """The single question of a standard query, or None when ``data`` is not one."""
    if len(data) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", data[:6])
    if flags & 0x8000 or (flags >> 11) & 0xF != 0 or qdcount != 1:
        return None  # a response, another opcode, or not exactly one question
    labels: list[str] = []
    at = 12
    while True:
        if at >= len(data) or len(labels) > _MAX_LABELS:
            return None
        length = data[at]
        at += 1
        if length == 0:
            break
        if length > 63 or at + length > len(data):
            return None  # compression pointers never occur in a question we accept
        try:
            labels.append(data[at : at + length].decode("ascii").lower())
        except UnicodeDecodeError:
            return None
        at += length
    if at + 4 > len(data):
        return None
    qtype, qclass = struct.unpack("!HH", data[at : at + 4])
    return Question(ident, flags, ".".join(labels), qtype, qclass, data[12 : at + 4])


def answer(
    question: Question, rcode: int, addresses: Sequence[ipaddress.IPv4Address] = ()
) -> bytes:
    """The response to ``question``: ``rcode``, with A records for ``addresses``."""
    flags = 0x8000 | 0x0080 | (question.flags & 0x0100) | rcode  # QR, RA, RD copied
    records = b"".join(
        struct.pack("!HHHIH", 0xC00C, TYPE_A, _CLASS_IN, _TTL, 4) + address.packed
        for address in addresses
    )
    header = struct.pack("!HHHHHH", question.id, flags, 1, len(addresses), 0, 0)
    return header + question.raw + records


def format_error(data: bytes) -> bytes | None:
    """FORMERR for a message with at least a header; None for anything shorter."""
    if len(data) < 12:
        return None
    ident = struct.unpack("!H", data[:2])[0]
    return struct.pack("!HHHHHH", ident, 0x8000 | _FORMERR, 0, 0, 0, 0)
