"""The Markdown side of the firewall, without a browser: the converter's setup and the
raw-HTML escaper (pure)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ringfence.sandboxd.browser._markdown import escape_raw_html, to_markdown

pytest.importorskip("html_to_markdown")

RAW_HTML = re.compile(r"(?<!\\)<[A-Za-z/!?]")


def prose(markdown: str) -> str:
    """``markdown`` outside fenced blocks and code spans."""
    return "".join("".join(chunk.split("`")[0::2]) for chunk in markdown.split("```")[0::2])


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("<img src=x onerror=y>", "\\<img src=x onerror=y>"),
        ("a < b and <!-- c --> <?php <!doctype", "a < b and \\<!-- c --> \\<?php \\<!doctype"),
        ("`<b>` then <b>", "`<b>` then \\<b>"),
        ("``a ` <b>`` <i>", "``a ` <b>`` \\<i>"),
        ("unmatched ` <b>", "unmatched ` \\<b>"),
        ("```html\n<div>\n```\n<div>", "```html\n<div>\n```\n\\<div>"),
        ("~~~\n<div>\n```\n<p>\n~~~\n<p>", "~~~\n<div>\n```\n<p>\n~~~\n\\<p>"),
        ("- ```\n  <li>\n  ```\n- <li>", "- ```\n  <li>\n  ```\n- \\<li>"),
        ("````\n```\n<x>\n````\n<x>", "````\n```\n<x>\n````\n\\<x>"),
        ("</script>", "\\</script>"),
    ],
)
def test_raw_html_openers_are_escaped_outside_code(markdown: str, expected: str) -> None:
    assert escape_raw_html(markdown) == expected


def test_the_converter_keeps_structure_and_passes_no_html() -> None:
    markdown = to_markdown(
        "<h2>Title</h2><p>&lt;svg onload=x&gt; <a href='https://a.example/x y'>t&lt;i&gt;</a>"
        " <img src='https://a.example/(p).png' alt='alt' title='tip'>"
        " <img src='data:image/png;base64,AAAA' alt='inline'></p>"
        "<pre><code class='lang-js'>if (a &lt; b) {}</code></pre>"
        "<table><tr><th>k</th><th>v</th></tr><tr><td>1</td><td>2</td></tr></table>"
        "<custom-tag>custom</custom-tag><div hidden>kept: the firewall decides</div>"
    )
    assert "## Title" in markdown
    assert "```js\nif (a < b) {}\n```" in markdown
    assert "| k | v |" in markdown
    assert "[t\\<i>](https://a.example/x%20y)" in markdown
    assert "![alt](https://a.example/%28p%29.png)" in markdown and "tip" not in markdown
    assert "inline" in markdown and "base64" not in markdown
    assert "custom" in markdown and "kept: the firewall decides" in markdown
    assert not RAW_HTML.search(prose(markdown)), markdown


# The renderer's view: what a CommonMark renderer (markdown-it-py) makes of the Markdown.


def _tokens(markdown: str) -> list[Any]:
    from markdown_it import MarkdownIt

    found = []
    for token in MarkdownIt("commonmark").parse(markdown):
        found.append(token)
        found.extend(token.children or [])
    return found


def _html_tokens(markdown: str) -> list[str]:
    return [t.content for t in _tokens(markdown) if t.type in ("html_block", "html_inline")]


def _hrefs(markdown: str) -> list[str]:
    """Where the Markdown's links and images point."""
    kinds = {"link_open": "href", "image": "src"}
    return [str(t.attrs.get(kinds[t.type])) for t in _tokens(markdown) if t.type in kinds]


def test_a_fence_commonmark_does_not_open_leaves_the_html_after_it_escaped() -> None:
    """Review 3 F1: "```x`" opens no fence (a backtick fence's info has no backtick), so
    the lines after it are Markdown, not code."""
    markdown = to_markdown(
        "<p>```x`</p><p>&lt;img src=x onerror=alert(1)&gt;</p>"
        "<p>&lt;script&gt;alert(2)&lt;/script&gt;</p><p>~~~</p><p>&lt;b onclick=x&gt;</p>"
    )
    assert _html_tokens(markdown) == [], markdown
    assert _html_tokens(escape_raw_html("```x`\n<img src=x onerror=alert(1)>")) == []


def test_a_pages_text_cannot_make_or_relabel_a_link() -> None:
    """Review 3 F12: link text (and alt text) with brackets stays the one link's text."""
    markdown = to_markdown(
        "<p><a href='https://ok.example/'>a](https://evil.example/) [b</a>"
        " [c](https://evil.example/) <img src='https://ok.example/i.png' "
        "alt='x](https://evil.example/) ![y'></p>"
    )
    assert _hrefs(markdown) == ["https://ok.example/", "https://ok.example/i.png"], markdown


_HOSTILE = [
    "```", "```x`", "``", "`", "~~~", "~~~x", "<", ">", "&lt;", "&gt;", "&amp;", "&amp;lt;",
    "\\", "[", "]", "(", ")", "!", "*", "_", "#", "-", "+", "1.", "|", "\n", "    ", " ",
    "&lt;img src=x onerror=alert(1)&gt;", "&lt;script&gt;", "&lt;/script&gt;",
    "&lt;!--", "&lt;?php", "&lt;!doctype", "&lt;http://x.test&gt;", "&lt;a@b.test&gt;",
    "](https://evil.example/)", "text",
]  # fmt: skip
_ELEMENTS = [
    "p", "pre", "code", "li", "blockquote", "h1", "h3", "b", "i", "kbd", "samp", "span",
    "td", "th", "dd", "dt",
]  # fmt: skip


def _html() -> Any:
    from hypothesis import strategies as st

    text = st.lists(st.sampled_from(_HOSTILE), max_size=8).map("".join)
    leaf = text | st.builds(
        lambda alt: f"<img src='https://ok.example/i.png' alt='{alt.replace(chr(39), '')}'>",
        text,
    )

    def nest(children: Any) -> Any:
        return st.builds(
            lambda tag, inner: (
                f"<a href='https://ok.example/'>{''.join(inner)}</a>"
                if tag == "a"
                else f"<ul><li>{''.join(inner)}</li></ul>"
                if tag == "li"
                else f"<table><tr><{tag}>{''.join(inner)}</{tag}></tr></table>"
                if tag in ("td", "th")
                else f"<dl><{tag}>{''.join(inner)}</{tag}></dl>"
                if tag in ("dd", "dt")
                else f"<{tag}>{''.join(inner)}</{tag}>"
            ),
            st.sampled_from([*_ELEMENTS, "a"]),
            st.lists(children, max_size=4),
        )

    return st.lists(st.recursive(leaf, nest, max_leaves=12), min_size=1, max_size=5).map("".join)


def test_no_hostile_page_text_becomes_html_or_a_link_in_a_renderer() -> None:
    """A property over hostile pages: markdown-it-py (CommonMark) finds no HTML in the
    Markdown, and no link or image to a URL the page's text wrote (only its own href and
    src attributes)."""
    hypothesis = pytest.importorskip("hypothesis")

    @hypothesis.settings(max_examples=1000, deadline=None, database=None)
    @hypothesis.given(_html())
    def check(html: str) -> None:
        markdown = to_markdown(html)
        assert _html_tokens(markdown) == [], (html, markdown)
        assert not [url for url in _hrefs(markdown) if "evil" in url], (html, markdown)

    check()
