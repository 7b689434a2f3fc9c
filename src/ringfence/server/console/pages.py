"""Rendering: Jinja2 with autoescape on, filters that make hidden characters visible, and
the security headers every console response carries.

Everything an agent wrote (rationale, command words, env names, reasons, logs) reaches a
page only through autoescaped expressions or the filters below, which escape it themselves;
no template marks such text safe.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from datetime import datetime
from importlib.resources import files
from typing import Any

import jinja2
from markupsafe import Markup, escape
from starlette.responses import HTMLResponse, RedirectResponse, Response

__all__ = [
    "SECURITY_HEADERS",
    "STYLESHEET",
    "expires_in",
    "redirect",
    "render",
    "secure",
    "shown",
    "visible",
]

SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}

STYLESHEET = files("ringfence.server.console").joinpath("static/console.css").read_bytes()

_LOG_CHARS = 16_000  # what a page shows of an execution's logs (the API has them whole)
_DETAIL_CHARS = 4_000


def _escaped(char: str) -> str:
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else (f"\\U{code:08x}")
    )


def visible(value: object, keep_lines: bool = False) -> Markup:
    """``value`` as HTML, with every character that would not show as itself (controls,
    bidirectional overrides, zero-width and non-breaking spaces, ...) written as a marked
    escape such as ``\\u202e``, so a command cannot look like another one. With
    ``keep_lines``, newlines and tabs stay (multi-line text)."""
    text = str(value)
    out: list[str] = []
    run: list[str] = []
    for char in text:
        if char.isprintable() or (keep_lines and char in "\n\t"):
            run.append(char)
            continue
        out.append(str(escape("".join(run))))
        run = []
        out.append(f'<span class="esc" title="hidden character">{escape(_escaped(char))}</span>')
    out.append(str(escape("".join(run))))
    return Markup("".join(out))


def shown(value: str, limit: int) -> tuple[str, int]:
    """At most ``limit`` characters of ``value`` (its tail), and how many were left out."""
    if len(value) <= limit:
        return value, 0
    return value[-limit:], len(value) - limit


def _when(value: datetime | str | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _size(value: int | None) -> str:
    """Bytes as people read them, the exact number beside: ``256 MiB (268435456 bytes)``."""
    if value is None:
        return "—"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift:
            return f"{value / (1 << shift):g} {unit} ({value} bytes)"
    return f"{value} bytes"


def expires_in(expires_at: datetime, now: datetime) -> str:
    """``in 59 min`` while an approval window is open, ``closed 3 min ago`` once it is not."""
    seconds = int((expires_at - now).total_seconds())
    minutes, hours = abs(seconds) // 60, abs(seconds) // 3600
    span = (
        f"{hours} h {minutes % 60} min"
        if hours
        else f"{minutes} min"
        if minutes
        else f"{abs(seconds)} s"
    )
    return f"expires in {span}" if seconds > 0 else f"closed {span} ago"


def _as_json(value: Any) -> str:
    text = json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + " …"


_env = jinja2.Environment(
    loader=jinja2.PackageLoader("ringfence.server.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["visible"] = visible
_env.filters["visible_text"] = lambda value: visible(value, keep_lines=True)
_env.filters["shell"] = lambda argv: visible(shlex.join(argv))
_env.filters["when"] = _when
_env.filters["as_json"] = _as_json
_env.filters["size"] = _size
_env.globals["LOG_CHARS"] = _LOG_CHARS
_env.globals["shown"] = shown


def secure(response: Response) -> Response:
    """Add the console's security headers (every console response has them)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


def render(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """The page ``template`` rendered with ``context``."""
    html = _env.get_template(template).render(**context)
    return HTMLResponse(html, status_code=status)


def redirect(path: str) -> RedirectResponse:
    """See other: after a form post, the browser GETs ``path`` (a console path)."""
    return RedirectResponse(path, status_code=303)
