"""The semantic firewall: what a person looking at the page would not see is left out.

``script(rules, only_main_content)`` is a JavaScript expression (``_firewall.js`` beside
this module, read at each call) for the agent to evaluate in the page, in an ISOLATED
WORLD: CDP ``Page.createIsolatedWorld`` for the main frame, then ``Runtime.evaluate`` with
its ``contextId`` and ``returnByValue: true``. Its value::

    {"html": str, "removed": {rule: int}, "removed_chars": int}

``html`` is the cleaned page (the rules applied; links absolute; no ``on*`` handlers,
``style`` attributes or ``javascript:`` URLs; only the main content when asked), ready for
``_markdown.to_markdown``. ``removed`` counts removed subtrees (elements or comments) under
the first rule that removed each, plus ``"limit"`` for what a work bound left out;
``removed_chars`` counts the text left out. The rules are
``ringfence.models.browser.FirewallRule``'s values (docs/browser.md, "The semantic
firewall", says what each removes and what none can).

Why an isolated world: the page's JavaScript (patched prototypes, ``JSON``,
``getComputedStyle``, setters on ``Object.prototype``) lives in the main world and is never
called from the isolated one; evaluated in the main world the script's answer is the
page's to forge. Why it cannot disturb a session: it reads the live DOM and never writes
it (it serializes while skipping, in one synchronous pass). If the script throws, the
evaluation reports an exception: the caller answers with an error, never the raw page.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

__all__ = ["LIMITS", "RULES", "script"]

RULES = ("non_content", "hidden", "aria_hidden", "offscreen", "zero_size", "same_color")

LIMITS = {
    "nodes": 400_000,  # nodes visited (and frames pending) before the rest is left out
    "ms": 8_000,  # milliseconds of work, checked every 256 nodes
    "chars": 32 * 1024 * 1024,  # characters of cleaned HTML
    "depth": 256,  # nesting emitted: deeper elements keep their text, not their tags
}

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_firewall.js")


def script(rules: Sequence[str], only_main_content: bool) -> str:
    """The expression that captures the page through the firewall's ``rules``.

    Raises:
        ValueError: a rule is not one of ``RULES``.
        OSError: ``_firewall.js`` cannot be read.
    """
    unknown = [rule for rule in rules if rule not in RULES]
    if unknown:
        raise ValueError("unknown firewall rules: " + ", ".join(map(repr, unknown)))
    with open(_SOURCE, encoding="utf-8") as source:
        function = source.read()
    arguments = [
        json.dumps(sorted(set(rules), key=RULES.index)),
        json.dumps(bool(only_main_content)),
        json.dumps(LIMITS),
    ]
    return "(" + function.strip() + ")(" + ", ".join(arguments) + ")"
