"""JSON and proto3-JSON helpers without the ``json`` package.

``json`` imports ``re`` (about 1.5 MB per process); the C accelerator ``_json`` that it wraps
does the real work and costs almost nothing, so the daemon drives it directly. Only a
malformed *string* inside a request makes ``_json`` import ``json.decoder`` to build its
exception (Python 3.12+; 3.11 raises a bare SystemError instead), a cost paid once, on a
bad request.

Nothing here imports ``typing`` at run time: it imports ``re`` and ``collections`` too.

Proto3 JSON rules accepted on input: camelCase or snake_case keys, 64-bit integers as numbers
or strings, enums as names or numbers, bytes as standard or URL-safe base64.
"""

from __future__ import annotations

import binascii
from _json import encode_basestring_ascii, make_scanner

from ._errors import invalid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Msg = dict[str, Any]

__all__ = [
    "b64decode",
    "b64encode",
    "dumps",
    "loads",
    "msg_bool",
    "msg_bytes",
    "msg_dict",
    "msg_enum",
    "msg_int",
    "msg_str",
    "msg_str_list",
    "msg_str_map",
]


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


class _ScanContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_reject_constant)


_scan = make_scanner(_ScanContext())  # type: ignore[arg-type]  # duck-typed context


def loads(data: bytes) -> Any:
    """Parse JSON text; raise ``RpcError(invalid_argument)`` on anything else."""
    try:
        text = data.decode("utf-8").strip(" \t\r\n")
        value, end = _scan(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError, RecursionError, SystemError) as exc:
        raise invalid(f"the request body is not valid JSON ({type(exc).__name__})") from None
    if end != len(text):
        raise invalid("the request body has trailing data after its JSON value")
    return value


def dumps(value: object) -> str:
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def _encode(value: object, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(encode_basestring_ascii(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(repr(value))
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(encode_basestring_ascii(str(key)))
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_"
_URLSAFE = bytes.maketrans(b"-_", b"+/")


def b64encode(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def b64decode(text: object, field: str) -> bytes:
    if not isinstance(text, str):
        raise invalid(f"{field} must be a base64 string")
    raw = text.encode("ascii", "replace").translate(_URLSAFE)
    if raw.translate(None, _B64_ALPHABET):
        raise invalid(f"{field} is not valid base64")
    if len(raw) % 4:
        raw += b"=" * (-len(raw) % 4)
    try:
        return binascii.a2b_base64(raw)
    except binascii.Error:
        raise invalid(f"{field} is not valid base64") from None


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _get(msg: Msg, name: str) -> Any:
    """The value of field ``name`` (snake_case) under either spelling, or None."""
    value = msg.get(name)
    if value is None and "_" in name:
        value = msg.get(_camel(name))
    return value


def msg_dict(msg: Msg, name: str) -> Msg | None:
    value = _get(msg, name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"{name} must be an object")
    return value


def msg_str(msg: Msg, name: str) -> str | None:
    value = _get(msg, name)
    if value is None or isinstance(value, str):
        return value
    raise invalid(f"{name} must be a string")


def msg_bool(msg: Msg, name: str) -> bool | None:
    value = _get(msg, name)
    if value is None or isinstance(value, bool):
        return value
    raise invalid(f"{name} must be a boolean")


def msg_int(msg: Msg, name: str, *, minimum: int = 0, maximum: int = 2**63 - 1) -> int | None:
    value = _get(msg, name)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 24:
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{name} must be an integer")
    if not minimum <= value <= maximum:
        raise invalid(f"{name} must be between {minimum} and {maximum}")
    return value


def msg_enum(msg: Msg, name: str, values: dict[str, int]) -> int | None:
    value = _get(msg, name)
    if value is None:
        return None
    if isinstance(value, str) and value in values:
        return values[value]
    if isinstance(value, int) and not isinstance(value, bool) and value in values.values():
        return value
    raise invalid(f"{name} must be one of {', '.join(values)}")


def msg_bytes(msg: Msg, name: str) -> bytes | None:
    value = _get(msg, name)
    return None if value is None else b64decode(value, name)


def msg_str_list(msg: Msg, name: str) -> list[str]:
    value = _get(msg, name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(f"{name} must be a list of strings")
    return value


def msg_str_map(msg: Msg, name: str) -> dict[str, str]:
    value = _get(msg, name)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise invalid(f"{name} must be an object of strings")
    return value
