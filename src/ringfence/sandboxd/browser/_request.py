"""Checking a ``/scrape`` body against ``ringfence.models.browser.ScrapeRequest`` by hand.

The agent cannot import pydantic, so it repeats the model's rules (fields, types, bounds,
enums, the actions' shapes) here and names the first field that breaks one, as
``actions[2].selector``. The server checks with the models first; this is the agent's own
door, for callers that reach it directly (the benchmark's floor, a CDP-less test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._errors import AgentError

FORMATS = ("markdown", "html", "raw_html", "screenshot", "screenshot@full_page", "links")
RULES = ("non_content", "hidden", "aria_hidden", "offscreen", "zero_size", "same_color")
MAX_ACTIONS = 50
_MAX_SELECTOR = 1024
_MAX_TEXT = 64 * 1024
_MAX_SCRIPT = 256 * 1024
_MAX_WAIT_MS = 60_000

_ACTION_FIELDS: dict[str, dict[str, Any]] = {
    "wait": {"milliseconds": None, "selector": None},
    "click": {"selector": ...},
    "write": {"text": ...},
    "press": {"key": ...},
    "scroll": {"direction": "down", "selector": None},
    "screenshot": {"full_page": False},
    "scrape": {},
    "execute_javascript": {"script": ...},
}


@dataclass(frozen=True)
class Cookie:
    name: str
    value: str
    domain: str | None = None
    path: str = "/"
    secure: bool = False
    http_only: bool = False


@dataclass(frozen=True)
class Action:
    """One action: ``type`` and its fields (defaults filled in)."""

    type: str
    fields: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]


@dataclass(frozen=True)
class ScrapeRequest:
    url: str | None = None
    formats: tuple[str, ...] = ("markdown",)
    only_main_content: bool = True
    wait_for: int = 0
    timeout: int = 30_000
    actions: tuple[Action, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    cookies: tuple[Cookie, ...] = ()
    firewall: tuple[str, ...] = RULES


def parse(body: Any) -> ScrapeRequest:
    """The request ``body`` (decoded JSON) asks for.

    Raises:
        AgentError: ``invalid_request``, naming the first field that is wrong.
    """
    fields = _object(body, "body", {
        "url", "formats", "only_main_content", "wait_for", "timeout", "actions", "headers",
        "cookies", "firewall",
    })  # fmt: skip
    url = fields.get("url")
    if url is not None:
        _string(url, "url", 1, 8192)
        if not url.lower().startswith(("http://", "https://")):
            raise _invalid("url", "must be an http:// or https:// URL")
    formats = tuple(_list(fields.get("formats", ["markdown"]), "formats", 1, 6))
    for index, name in enumerate(formats):
        _choice(name, f"formats[{index}]", FORMATS)
    rules = tuple(_list(fields.get("firewall", list(RULES)), "firewall", 0, 64))
    for index, name in enumerate(rules):
        _choice(name, f"firewall[{index}]", RULES)
    headers = fields.get("headers", {})
    _headers(headers)
    raw_cookies = _list(fields.get("cookies", []), "cookies", 0, 100)
    raw_actions = _list(fields.get("actions", []), "actions", 0, MAX_ACTIONS)
    return ScrapeRequest(
        url=url,
        formats=formats,
        only_main_content=_bool(fields.get("only_main_content", True), "only_main_content"),
        wait_for=_int(fields.get("wait_for", 0), "wait_for", 0, _MAX_WAIT_MS),
        timeout=_int(fields.get("timeout", 30_000), "timeout", 1000, 300_000),
        actions=tuple(_action(a, f"actions[{i}]") for i, a in enumerate(raw_actions)),
        headers=dict(headers),
        cookies=tuple(_cookie(c, f"cookies[{i}]") for i, c in enumerate(raw_cookies)),
        firewall=rules,
    )


def _action(raw: Any, where: str) -> Action:
    if not isinstance(raw, dict):
        raise _invalid(where, "must be an object")
    kind = raw.get("type")
    if kind not in _ACTION_FIELDS:
        raise _invalid(f"{where}.type", f"must be one of {', '.join(_ACTION_FIELDS)}")
    spec = _ACTION_FIELDS[kind]
    _object(raw, where, {"type", *spec})
    values: dict[str, Any] = {}
    for name, default in spec.items():
        if name not in raw or raw[name] is None:
            if default is ...:
                raise _invalid(f"{where}.{name}", "is required")
            values[name] = default
            continue
        value, path = raw[name], f"{where}.{name}"
        if name == "selector":
            _string(value, path, 1, _MAX_SELECTOR)
        elif name == "milliseconds":
            _int(value, path, 0, _MAX_WAIT_MS)
        elif name == "text":
            _string(value, path, 0, _MAX_TEXT)
        elif name == "key":
            _string(value, path, 1, 32)
        elif name == "direction":
            _choice(value, path, ("up", "down"))
        elif name == "full_page":
            _bool(value, path)
        elif name == "script":
            _string(value, path, 1, _MAX_SCRIPT)
        values[name] = value
    if kind == "wait" and (values["milliseconds"] is None) == (values["selector"] is None):
        raise _invalid(where, "a wait names either milliseconds or selector")
    return Action(kind, values)


def _cookie(raw: Any, where: str) -> Cookie:
    fields = _object(raw, where, {"name", "value", "domain", "path", "secure", "http_only"})
    for required in ("name", "value"):
        if required not in fields:
            raise _invalid(f"{where}.{required}", "is required")
    domain = fields.get("domain")
    if domain is not None:
        _string(domain, f"{where}.domain", 0, 253)
    return Cookie(
        name=_string(fields["name"], f"{where}.name", 1, 256),
        value=_string(fields["value"], f"{where}.value", 0, 4096),
        domain=domain,
        path=_string(fields.get("path", "/"), f"{where}.path", 0, 1024),
        secure=_bool(fields.get("secure", False), f"{where}.secure"),
        http_only=_bool(fields.get("http_only", False), f"{where}.http_only"),
    )


def _headers(headers: Any) -> None:
    if not isinstance(headers, dict):
        raise _invalid("headers", "must be an object")
    if len(headers) > 64:
        raise _invalid("headers", "at most 64 headers")
    for name, value in headers.items():
        if not isinstance(value, str):
            raise _invalid(f"headers.{name}", "must be a string")
        if not name or any(c in name for c in "\r\n:\0 ") or any(c in value for c in "\r\n\0"):
            raise _invalid(f"headers.{name}", "not a valid header")


def _object(raw: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _invalid(where, "must be an object")
    for name in raw:
        if name not in allowed:
            path = name if where == "body" else f"{where}.{name}"
            raise _invalid(path, "is not a known field")
    return raw


def _list(raw: Any, where: str, least: int, most: int) -> list[Any]:
    if not isinstance(raw, list):
        raise _invalid(where, "must be a list")
    if not least <= len(raw) <= most:
        raise _invalid(where, f"must have {least} to {most} items")
    return raw


def _string(raw: Any, where: str, least: int, most: int) -> str:
    if not isinstance(raw, str):
        raise _invalid(where, "must be a string")
    if not least <= len(raw) <= most:
        raise _invalid(where, f"must be {least} to {most} characters")
    return raw


def _int(raw: Any, where: str, least: int, most: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _invalid(where, "must be an integer")
    if not least <= raw <= most:
        raise _invalid(where, f"must be between {least} and {most}")
    return raw


def _bool(raw: Any, where: str) -> bool:
    if not isinstance(raw, bool):
        raise _invalid(where, "must be true or false")
    return raw


def _choice(raw: Any, where: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise _invalid(where, f"must be one of {', '.join(choices)}")
    return str(raw)


def _invalid(where: str, why: str) -> AgentError:
    return AgentError("invalid_request", f"{where}: {why}")
