"""The Markdown side of the firewall, without a browser: the converter's setup and the
raw-HTML escaper (pure)."""

from __future__ import annotations

import re

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
