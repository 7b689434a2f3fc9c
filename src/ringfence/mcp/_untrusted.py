"""Web content as an agent's harness should read it: wrapped, marked untrusted, and unable
to end its own wrapper (pure helpers).

A page is the page author's text, and an author who wants to steer an agent writes
instructions into it. The wrapper tells the harness (and the model) where that text starts
and ends::

    <untrusted-web-content-7f3a9c0e2b4d6a81 source="https://site.test/" firewall-removed="3">
    ...the page's Markdown...
    </untrusted-web-content-7f3a9c0e2b4d6a81>

The page must not be able to close the wrapper early and write "trusted" text after it.
Two layers. The tag's name ends in a random nonce drawn for each call (``nonce()``): the
page cannot know it, so no text it writes is the wrapper's end, and a reader told "only the
tag with this nonce closes it" cannot be fooled. And every tag that looks like the base
name inside the content is defused (its ``<`` becomes ``&lt;``), recognised the way a
reader would, not byte for byte: in any case; with spaces, underscores, invisible (format)
characters, dashes of any kind or none between its words; with a backslash for the slash;
with the full-width, small, angle-quotation or mathematical forms of ``<``.
"""

from __future__ import annotations

import html
import secrets
import unicodedata

__all__ = ["TAG", "defuse", "nonce", "wrap"]

TAG = "untrusted-web-content"
_NAME = TAG.replace("-", "")  # what is compared: separators are not
# '<', FULLWIDTH and SMALL LESS-THAN SIGN, SINGLE LEFT ANGLE QUOTATION MARK, MATHEMATICAL and
# CJK LEFT ANGLE BRACKETS, LEFT-POINTING ANGLE BRACKET, LESS-THAN SIGN's look-alikes.
_BRACKETS = "<\uff1c\ufe64\u2039\u27e8\u3008\u2329\u02c2\u1438"
# Letters of other scripts that look like the tag's (Unicode's confusables for them, Cyrillic,
# Greek and Armenian): NFKC leaves them as they are, a reader takes them for the Latin ones.
_LOOKALIKES = str.maketrans(
    "\u0435\u043e\u0441\u0455\u0501\u0440\u0442\u0475\u051d\u0432"
    "\u03bf\u03c5\u03c4\u03b5\u03bd\u0575\u0578\u057d",
    "eocsdptvwboutevjnu",
)
# How far past a bracket a tag's name is looked for: invisible characters between its letters
# are skipped, up to this many characters in all (a page padding one past it only gets its
# text shown with the padding, which no reader takes for a tag).
_SCAN = 4096


def _visible(char: str) -> str:
    """What a reader sees of ``char``, as compared with the name: NFKC-folded, lower case,
    a backslash or a slash as '/', nothing for whitespace, dashes, underscores and
    invisible (format, control, combining) characters."""
    kept = []
    for folded in unicodedata.normalize("NFKC", char):
        category = unicodedata.category(folded)
        if folded.isspace() or folded == "_" or category in ("Cf", "Cc", "Mn", "Me", "Pd"):
            continue
        kept.append("/" if folded in "\\/\u2044\u2215" else folded)
    return "".join(kept).casefold().translate(_LOOKALIKES)


def _opens_tag(text: str, at: int) -> bool:
    """Whether the bracket at ``at`` starts an opening or closing tag of the wrapper's name."""
    seen = ""
    for index in range(at + 1, min(len(text), at + 1 + _SCAN)):
        seen += _visible(text[index])
        name = seen.lstrip("/")
        if len(name) >= len(_NAME) or (name and not _NAME.startswith(name)):
            return name.startswith(_NAME)
        if seen.count("/") > 2:  # '<///' is no tag ('<\/' is: a script's escape)
            return False
    return False


def nonce() -> str:
    """A fresh random suffix for one wrapper's tag name (64 bits, hex)."""
    return secrets.token_hex(8)


def defuse(text: str) -> str:
    """``text`` with every tag of the wrapper's name made inert (its bracket escaped)."""
    parts = []
    start = 0
    for at, char in enumerate(text):
        if char in _BRACKETS and _opens_tag(text, at):
            parts.append(text[start:at])
            parts.append("&lt;")
            start = at + 1
    parts.append(text[start:])
    return "".join(parts)


def wrap(
    content: str, source: str, attributes: dict[str, str] | None = None, *, key: str | None = None
) -> str:
    """``content`` inside the wrapper named ``TAG-key`` (``key`` a fresh ``nonce()`` when not
    given), defused; ``source`` (the page's URL) and ``attributes`` (Ringfence's own words,
    such as what the firewall removed) escaped as attribute values."""
    name = f"{TAG}-{key or nonce()}"
    fields = {"source": source, **(attributes or {})}
    shown = " ".join(f'{name}="{html.escape(value, quote=True)}"' for name, value in fields.items())
    body = defuse(content)
    if body and not body.endswith("\n"):
        body += "\n"
    return f"<{name} {shown}>\n{body}</{name}>"
