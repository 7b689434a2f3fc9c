"""HTML to Markdown for agents: PyPI's ``html-to-markdown`` (its Rust core), set up so that
the Markdown keeps code blocks (with the language their class names), tables and ATX
headings, and carries no raw HTML and no structure the page's text made.

The converter is imported when a call needs it: the ``browser`` template recipe installs it
in sandboxes; where it is missing, ``ConverterMissing`` says so. The input is the semantic
firewall's cleaned HTML (``_firewall.py``); the converter's own rules are turned off where
they would decide what is hidden (the firewall decides: with ``firewall=[]`` a call asked
for everything).

No raw HTML, decided at the source: the page's text is escaped as the converter emits it
(``_Visitor.visit_text``), outside the code the converter writes itself (``pre``, ``code``,
``kbd``, ``samp``, ``tt``): every ``\\``, `````, ``~``, ``<``, ``[``, ``]`` and entity-like
``&`` gets a backslash. So text can open no code span or fence (which could swallow the
converter's own fences and leave their content outside code), no tag, comment or autolink,
no link or image (``a](https://evil/) [b`` stays text), no entity. Every ``<`` a renderer
could read as HTML is then either escaped or inside code the converter chose (its fences
are longer than any run of backticks they hold). Links and images are written here:
inline, their text escaped the same way, their URLs percent-encoded where Markdown would
need ``<url>``, without titles (a tooltip nobody sees unless hovering). ``escape_raw_html``
stays behind as a second layer: it escapes any ``<`` that could still open HTML outside
what it can prove is code (it only adds backslashes, so misjudging code costs a visible
backslash, never markup).
"""

from __future__ import annotations

import re
from html import escape as html_escape
from html.parser import HTMLParser
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
    result = module.convert(stand_in_text(html), options, visitor=_Visitor())
    return escape_raw_html((result.content or "").translate(_PUT_BACK))


_URL_UNSAFE = re.compile(r"[\x00-\x20\x7f<>()\\]")


def _destination(url: str) -> str:
    return _URL_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", url.strip())


_SPECIAL = "\\`~<[]&"
# Each special character of the page's text stands in the HTML the converter reads as a
# private-use character (the page's own are replaced first), put back escaped afterwards:
# the converter cannot mistake the page's text for structure, and needs no visitor for it.
_STAND_IN = {char: chr(0xE000 + index) for index, char in enumerate(_SPECIAL)}
_PUT_BACK = {ord(stand_in): "\\" + char for char, stand_in in _STAND_IN.items()}
_STAND_INS = re.compile("[\ue000-\ue00f]")
# What could start structure: always a backslash, backtick, tilde or bracket; a "<" or "&"
# where a tag, comment, autolink or entity could follow (or a tag that ends the text).
_TEXT_SPECIAL = re.compile(r"[\\`~\[\]]|<(?=[A-Za-z/!?]|\Z)|&(?=#?[A-Za-z0-9]+;|\Z)")
_INLINE_CODE = frozenset({"code", "kbd", "samp", "tt"})
_VERBATIM = frozenset({"pre", "listing", "xmp", "plaintext"})
# Where a ``pre`` becomes a fenced block of its own: under blocks only (in a table cell, a
# heading, a paragraph or a link the converter flattens it into the line around it).
_BLOCKS = frozenset({
    "html", "body", "main", "article", "section", "div", "header", "footer", "nav", "aside",
    "blockquote", "ul", "ol", "li", "dl", "dd", "figure", "details", "form", "fieldset",
    "center", "search", "hgroup", "address",
})  # fmt: skip
_VOID = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
    "source", "track", "wbr",
})  # fmt: skip


def escape_text(text: str) -> str:
    """The page's ``text`` as Markdown that means that text and nothing else: no code,
    HTML, link, image or entity can start in it."""
    return _TEXT_SPECIAL.sub(lambda m: "\\" + m.group(), text)


class _StandIns(HTMLParser):
    """The HTML again, its text with ``_STAND_IN``'s characters except inside a ``pre``
    that only blocks contain (the converter fences it, longer than any run inside) and an
    inline ``code`` that holds only text (the converter delimits it, longer than any run
    inside); a ``code`` with elements inside is flattened or split by the converter, so its
    text gets stand-ins too."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.open: list[str] = []
        self.verbatim = 0  # how many of the open elements are such pre's
        self.code: list[tuple[int, str]] | None = None  # an inline code's text so far

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.code is not None:  # not text only: its text so far gets stand-ins
            for index, data in self.code:
                self.out[index] = _stood_in(data)
            self.code = None
        self.out.append(self.get_starttag_text() or "")
        if tag in _VOID:
            return
        if tag in _INLINE_CODE and not self.verbatim and _INLINE_CODE.isdisjoint(self.open):
            self.code = []
        if tag in _VERBATIM and (self.verbatim or all(t in _BLOCKS for t in self.open)):
            self.verbatim += 1
        elif tag in _VERBATIM:
            tag = "pre-flattened"
        self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        self.code = None
        self.out.append(f"</{tag}>")
        names = [tag, "pre-flattened"] if tag in _VERBATIM else [tag]
        for depth in range(len(self.open) - 1, -1, -1):
            if self.open[depth] in names:
                for closed in self.open[depth:]:
                    self.verbatim -= closed in _VERBATIM
                del self.open[depth:]
                return

    def handle_data(self, data: str) -> None:
        if self.code is not None:
            self.code.append((len(self.out), data))
        elif not self.verbatim:
            self.out.append(_stood_in(data))
            return
        self.out.append(html_escape(data, quote=False))

    def handle_decl(self, decl: str) -> None:
        self.out.append(f"<!{decl}>")


def _stood_in(data: str) -> str:
    return html_escape(_TEXT_SPECIAL.sub(lambda m: _STAND_IN[m.group()], data), quote=False)


def stand_in_text(html: str) -> str:
    """``html`` with its text's special characters (outside code) as stand-ins."""
    parser = _StandIns()
    # "<![" (a CDATA or marked section: none in the firewall's HTML) is text here; Python's
    # parser would stop at it.
    parser.feed(_STAND_INS.sub("\ufffd", html).replace("<![", "&lt;!["))
    parser.close()
    return "".join(parser.out)


class _Visitor:
    """The converter's visitor: links and images as ``[text](url)``, ``![alt](url)``."""

    def visit_link(self, _ctx: object, href: str, text: str, _title: object) -> dict[str, str]:
        # ``text`` is converted already: its page text holds stand-ins, put back escaped.
        if not href:
            return {"type": "custom", "output": text}
        return {"type": "custom", "output": f"[{text}]({_destination(href)})"}

    def visit_image(self, _ctx: object, src: str, alt: str, _title: object) -> dict[str, str]:
        # ``alt`` is the attribute as the page wrote it: not yet escaped.
        if src.startswith("data:"):
            return {"type": "custom", "output": escape_text(alt)}
        return {"type": "custom", "output": f"![{escape_text(alt)}]({_destination(src)})"}


_FENCE = re.compile(r"^[ \t>*+\-\d.)]*?(`{3,}|~{3,})")
# A ``<`` that could open HTML and is not escaped already (an even run of backslashes
# before it escapes only themselves).
_TAG_OPENER = re.compile(r"(?<!\\)((?:\\\\)*)<(?=[A-Za-z/!?])")
_BACKTICKS = re.compile(r"`+")


def escape_raw_html(markdown: str) -> str:
    """Escape each ``<`` that opens raw HTML (a tag, comment, declaration or autolink) in
    ``markdown``, outside fenced code blocks and code spans; one escaped already is left
    as it is."""
    lines = markdown.split("\n")
    fence: str | None = None
    for index, line in enumerate(lines):
        match = _FENCE.match(line)
        if fence is not None:
            closes = match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence)
            if closes and match and not line[match.end() :].strip():
                fence = None
            continue
        if match and not (match.group(1)[0] == "`" and "`" in line[match.end() :]):
            fence = match.group(1)  # (CommonMark: a backtick fence's info has no backtick)
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
        escaped = (opener.start() - len(line[: opener.start()].rstrip("\\"))) % 2 == 1
        if closer is None or escaped:  # literal backticks (unmatched, or escaped): text goes on
            pieces.append(_TAG_OPENER.sub(r"\1\\<", line[position : opener.end()]))
            position = opener.end()
            continue
        pieces.append(_TAG_OPENER.sub(r"\1\\<", line[position : opener.start()]))
        pieces.append(line[opener.start() : closer.end()])
        position = closer.end()
    pieces.append(_TAG_OPENER.sub(r"\1\\<", line[position:]))
    return "".join(pieces)
