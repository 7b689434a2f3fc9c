"""The agent's own page scripts (run in its isolated world) and the keys ``press`` knows.

Each function returns one JavaScript expression; arguments are embedded as JSON, never
pasted as code.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser

MAX_LINKS = 10_000
MAX_URL = 8192  # characters of a URL the page set (pushState allows megabytes)
MAX_TEXT = 4096  # characters of the title and the description
MAX_LANGUAGE = 64

METADATA = (
    """(() => {
  const meta = document.querySelector('meta[name="description" i]');
  const text = (value, most) =>
    (typeof value === "string" && value.trim()) ? value.trim().slice(0, most) : null;
  return {
    url: String(location.href).slice(0, MAX_URL),
    title: text(document.title, MAX_TEXT),
    description: meta ? text(meta.getAttribute("content"), MAX_TEXT) : null,
    language: document.documentElement ? text(document.documentElement.lang, MAX_LANGUAGE) : null,
  };
})()""".replace("MAX_URL", str(MAX_URL))
    .replace("MAX_TEXT", str(MAX_TEXT))
    .replace("MAX_LANGUAGE", str(MAX_LANGUAGE))
)

RAW_HTML = """(() => {
  const root = document.documentElement;
  if (!root) return "";
  const doctype = document.doctype ? new XMLSerializer().serializeToString(document.doctype) : "";
  return doctype + root.outerHTML;
})()"""

LINKS = """(() => {
  const seen = new Set(), out = [];
  for (const a of document.querySelectorAll("a[href]")) {
    let href = a.href;
    if (typeof href !== "string") {
      try { href = new URL(a.getAttribute("href"), document.baseURI).href; } catch (e) { continue; }
    }
    if (!href || href.length > MAX_URL || /^javascript:/i.test(href) || seen.has(href)) continue;
    seen.add(href);
    out.push(href);
    if (out.length >= MAX_LINKS) break;
  }
  return out;
})()""".replace("MAX_LINKS", str(MAX_LINKS)).replace("MAX_URL", str(MAX_URL))

_FIND = """(async (selector, milliseconds, scroll) => {
  const end = performance.now() + milliseconds;
  const visible = (el) => {
    const box = el.getBoundingClientRect();
    if (box.width <= 0 || box.height <= 0) return false;
    if (el.checkVisibility) return el.checkVisibility({visibilityProperty: true});
    const style = getComputedStyle(el);
    return style.visibility !== "hidden" && style.display !== "none";
  };
  for (;;) {
    const el = document.querySelector(selector);
    if (el && visible(el)) {
      if (scroll) el.scrollIntoView({block: "center", inline: "center", behavior: "instant"});
      const box = el.getBoundingClientRect();
      return {x: box.left + box.width / 2, y: box.top + box.height / 2};
    }
    if (performance.now() >= end) return null;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
})(%s, %s, %s)"""

_SCROLL = """((selector, direction) => {
  const el = selector === null ? null : document.querySelector(selector);
  const sign = direction === "up" ? -1 : 1;
  if (el) el.scrollBy({top: sign * el.clientHeight, behavior: "instant"});
  else window.scrollBy({top: sign * window.innerHeight, behavior: "instant"});
  return true;
})(%s, %s)"""


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: dict[str, None] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a" or len(self.found) >= MAX_LINKS:
            return
        href = dict(attrs).get("href") or ""
        if href and len(href) <= MAX_URL and href.lower().startswith(("http:", "https:")):
            self.found.setdefault(href, None)


def links_in(cleaned_html: str) -> list[str]:
    """The links of the firewall's cleaned HTML (absolute already), in order, once each:
    a link the firewall removed (hidden, off-screen...) is not among them. At most
    ``MAX_LINKS``, each at most ``MAX_URL`` characters (longer ones are left out)."""
    parser = _Anchors()
    parser.feed(cleaned_html)
    parser.close()
    return list(parser.found)


def bounded(value: object, most: int) -> str | None:
    """``value`` as a string of at most ``most`` characters, or ``None``."""
    return str(value)[:most] if value else None


SETTLE = "new Promise((resolve) => setTimeout(resolve, 50))"


def find(selector: str, milliseconds: int, scroll: bool) -> str:
    """The centre ``{x, y}`` of the first visible element ``selector`` matches (scrolled
    into view first if ``scroll``), waiting up to ``milliseconds``; ``null`` if none. A
    selector that is not valid CSS throws."""
    return _FIND % (json.dumps(selector), int(milliseconds), "true" if scroll else "false")


def scroll(selector: str | None, direction: str) -> str:
    """Scroll the element (or the page) by one of its viewports ``direction``."""
    return _SCROLL % (json.dumps(selector), json.dumps(direction))


# key -> (code, windowsVirtualKeyCode, text): what Input.dispatchKeyEvent needs.
NAMED_KEYS: dict[str, tuple[str, int, str]] = {
    "Enter": ("Enter", 13, "\r"),
    "Tab": ("Tab", 9, ""),
    "Escape": ("Escape", 27, ""),
    "Backspace": ("Backspace", 8, ""),
    "Delete": ("Delete", 46, ""),
    "ArrowUp": ("ArrowUp", 38, ""),
    "ArrowDown": ("ArrowDown", 40, ""),
    "ArrowLeft": ("ArrowLeft", 37, ""),
    "ArrowRight": ("ArrowRight", 39, ""),
    "Home": ("Home", 36, ""),
    "End": ("End", 35, ""),
    "PageUp": ("PageUp", 33, ""),
    "PageDown": ("PageDown", 34, ""),
    " ": ("Space", 32, " "),
}
_PUNCTUATION = {
    "-": ("Minus", 189), "=": ("Equal", 187), "[": ("BracketLeft", 219),
    "]": ("BracketRight", 221), "\\": ("Backslash", 220), ";": ("Semicolon", 186),
    "'": ("Quote", 222), ",": ("Comma", 188), ".": ("Period", 190), "/": ("Slash", 191),
    "`": ("Backquote", 192),
}  # fmt: skip


def key_event(key: str) -> dict[str, object] | None:
    """``Input.dispatchKeyEvent``'s fields for ``key`` (a named key or one character), or
    ``None`` if it names no key the agent knows."""
    if key in NAMED_KEYS:
        code, virtual, text = NAMED_KEYS[key]
    elif len(key) == 1:
        text = key
        if key.isascii() and key.isalpha():
            code, virtual = f"Key{key.upper()}", ord(key.upper())
        elif key.isascii() and key.isdigit():
            code, virtual = f"Digit{key}", ord(key)
        else:
            code, virtual = _PUNCTUATION.get(key, ("", 0))
    else:
        return None
    event: dict[str, object] = {"key": key, "code": code, "windowsVirtualKeyCode": virtual}
    if text:
        event["text"] = text
        event["unmodifiedText"] = text
    return event
