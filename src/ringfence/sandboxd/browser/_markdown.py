"""HTML to Markdown for agents: PyPI's ``html-to-markdown`` (its Rust core), set up so that
the Markdown keeps code blocks (with the language their class names), tables and ATX
headings, and carries no raw HTML.

The converter is imported when a call needs it: the ``browser`` template recipe installs it
in sandboxes; where it is missing, ``ConverterMissing`` says so. The input is the semantic
firewall's cleaned HTML (``_firewall.py``); the converter's own rules are turned off where
they would decide what is hidden (the firewall decides: with ``firewall=[]`` a call asked
for everything).

No raw HTML: the converter writes a page's text as it reads, so text such as ``<img
src=x onerror=...>`` would be raw HTML to any Markdown renderer. Every ``<`` that could
open a tag, a comment or an autolink outside code is escaped (``\\<``); code spans and
fenced blocks keep theirs verbatim. Links and images are written here (``_Links``): inline,
their URLs percent-encoded where Markdown would need ``<url>``, without titles (a tooltip
nobody sees unless hovering), so no ``<`` is needed anywhere else.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ConverterMissing", "to_markdown"]

_PACKAGE = "html-to-markdown"


class ConverterMissing(Exception):
    """The Markdown converter is not installed here."""


_options: Any = None


def _converter() -> tuple[Any, Any]:
    global _options
    try:
        import html_to_markdown
    except ImportError as exc:
        raise ConverterMissing(
            f"the Markdown converter (PyPI's {_PACKAGE}) is not installed in this sandbox: "
            "start it from a template built with the 'browser' recipe"
        ) from exc
    if _options is None:
        _options = html_to_markdown.ConversionOptions(
            heading_style="atx",
            code_block_style="backticks",
            autolinks=False,
            extract_metadata=False,
            hidden_content="all",  # the firewall decides what is hidden
            inline_data_media="alt_text_only",  # base64 floods a context window
            url_escape_style="angle",
            link_style="inline",
            escape_asterisks=False,
            escape_underscores=False,
            escape_misc=False,
            wrap=False,
        )
    return html_to_markdown, _options


def to_markdown(html: str) -> str:
    """``html`` as Markdown, with no raw HTML outside code.

    Raises:
        ConverterMissing: PyPI's ``html-to-markdown`` is not installed.
    """
    module, options = _converter()
    result = module.convert(html, options, visitor=_Links())
    return escape_raw_html(result.content or "")


_URL_UNSAFE = re.compile(r"[\x00-\x20\x7f<>()\\]")


def _destination(url: str) -> str:
    return _URL_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", url.strip())


class _Links:
    """The converter's visitor: links and images as ``[text](url)``, ``![alt](url)``."""

    def visit_link(self, _ctx: object, href: str, text: str, _title: object) -> dict[str, str]:
        if not href:
            return {"type": "custom", "output": text}
        return {"type": "custom", "output": f"[{text}]({_destination(href)})"}

    def visit_image(self, _ctx: object, src: str, alt: str, _title: object) -> dict[str, str]:
        if src.startswith("data:"):
            return {"type": "custom", "output": alt}
        return {"type": "custom", "output": f"![{alt}]({_destination(src)})"}


_FENCE = re.compile(r"^[ \t>*+\-\d.)]*?(`{3,}|~{3,})")
_TAG_OPENER = re.compile(r"<(?=[A-Za-z/!?])")
_BACKTICKS = re.compile(r"`+")


def escape_raw_html(markdown: str) -> str:
    """Escape each ``<`` that opens raw HTML (a tag, comment, declaration or autolink) in
    ``markdown``, outside fenced code blocks and code spans."""
    lines = markdown.split("\n")
    fence: str | None = None
    for index, line in enumerate(lines):
        match = _FENCE.match(line)
        if fence is not None:
            closes = match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence)
            if closes and match and not line[match.end() :].strip():
                fence = None
            continue
        if match:
            fence = match.group(1)
            continue
        lines[index] = _escape_outside_code_spans(line)
    return "\n".join(lines)


def _escape_outside_code_spans(line: str) -> str:
    if "<" not in line:
        return line
    pieces: list[str] = []
    position = 0
    while position < len(line):
        opener = _BACKTICKS.search(line, position)
        if opener is None:
            break
        closer = _BACKTICKS.search(line, opener.end())
        while closer is not None and len(closer.group()) != len(opener.group()):
            closer = _BACKTICKS.search(line, closer.end())
        if closer is None:  # an unmatched run is literal backticks: text goes on after it
            pieces.append(_TAG_OPENER.sub(r"\\<", line[position : opener.end()]))
            position = opener.end()
            continue
        pieces.append(_TAG_OPENER.sub(r"\\<", line[position : opener.start()]))
        pieces.append(line[opener.start() : closer.end()])
        position = closer.end()
    pieces.append(_TAG_OPENER.sub(r"\\<", line[position:]))
    return "".join(pieces)
