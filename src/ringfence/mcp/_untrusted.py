"""Web content as an agent's harness should read it: wrapped, marked untrusted, and unable
to end its own wrapper (pure helpers).

A page is the page author's text, and an author who wants to steer an agent writes
instructions into it. The wrapper tells the harness (and the model) where that text starts
and ends::

    <untrusted-web-content source="https://site.test/" firewall-removed="3 elements, 12 chars">
    ...the page's Markdown...
    </untrusted-web-content>

The page must not be able to close the wrapper early and write "trusted" text after it, so
every tag of the wrapper's name inside the content is defused: its ``<`` becomes ``&lt;``.
A tag is recognised the way a reader would recognise it, not byte for byte: in any case,
with spaces, invisible (format) characters or dashes of any kind inside it, and with the
full-width or small forms of ``<``.
"""

from __future__ import annotations

import html
import unicodedata

__all__ = ["TAG", "defuse", "wrap"]

TAG = "untrusted-web-content"
_BRACKETS = "<\uff1c\ufe64"  # '<', FULLWIDTH LESS-THAN SIGN, SMALL LESS-THAN SIGN
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
    """What a reader sees of ``char``: NFKC-folded, lower case, any dash as '-', nothing
    for whitespace and invisible (format, control, combining) characters."""
    kept = []
    for folded in unicodedata.normalize("NFKC", char):
        category = unicodedata.category(folded)
        if folded.isspace() or category in ("Cf", "Cc", "Mn", "Me"):
            continue
        kept.append("-" if category == "Pd" else folded)
    return "".join(kept).casefold().translate(_LOOKALIKES)


def _opens_tag(text: str, at: int) -> bool:
    """Whether the bracket at ``at`` starts an opening or closing tag of the wrapper's name."""
    seen = ""
    for index in range(at + 1, min(len(text), at + 1 + _SCAN)):
        seen += _visible(text[index])
        name = seen.lstrip("/")
        if len(name) >= len(TAG) or (name and not TAG.startswith(name)):
            return name.startswith(TAG)
        if seen.count("/") > 1:  # '<//' is no tag
            return False
    return False


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


def wrap(content: str, source: str, attributes: dict[str, str] | None = None) -> str:
    """``content`` inside the wrapper, defused; ``source`` (the page's URL) and
    ``attributes`` (Ringfence's own words, such as what the firewall removed) escaped as
    attribute values."""
    fields = {"source": source, **(attributes or {})}
    shown = " ".join(f'{name}="{html.escape(value, quote=True)}"' for name, value in fields.items())
    body = defuse(content)
    if body and not body.endswith("\n"):
        body += "\n"
    return f"<{TAG} {shown}>\n{body}</{TAG}>"
