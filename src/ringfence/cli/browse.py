"""``ringfence browse URL``: render a page in a sandboxed Chromium and print what an agent
can use (Markdown by default), through the SDK (docs/browser.md).

The option parsing is pure (``scrape_options``, ``read_actions``, ``firewall_line``) so it is
tested without a server; the command is a thin shell over them and the SDK.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from ringfence.cli._common import fail
from ringfence.cli.sandbox import client_errors
from ringfence.models.browser import ALL_FIREWALL_RULES, FirewallReport, ScrapeResult

__all__ = ["browse", "firewall_line", "parse_firewall", "read_actions"]

# What stdout shows, by flag (one of them, unless --json prints the whole result).
_TEXT_FORMATS = {"markdown": "markdown", "html": "html", "raw_html": "raw_html", "links": "links"}


def read_actions(given: Sequence[str], source: IO[str] | None) -> list[dict[str, Any]]:
    """The actions of ``--action JSON`` (each one object) then ``--actions FILE`` (a list of
    objects), in that order, as JSON objects (the SDK checks their fields).

    Raises:
        click.BadParameter: not JSON, or not the shape said.
    """
    actions: list[dict[str, Any]] = []
    for text in given:
        value = _json(text, "--action")
        if not isinstance(value, dict):
            raise click.BadParameter("takes one JSON object per action", param_hint="--action")
        actions.append(value)
    if source is not None:
        value = _json(source.read(), "--actions")
        if not isinstance(value, list) or not all(isinstance(a, dict) for a in value):
            raise click.BadParameter("takes a JSON list of action objects", param_hint="--actions")
        actions.extend(value)
    return actions


def _json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from None


def parse_firewall(rules: str | None, off: bool) -> list[str] | None:
    """The firewall's rules: ``--firewall a,b`` (names checked here), ``--no-firewall`` (none),
    else None (the default: all).

    Raises:
        click.UsageError: both given. click.BadParameter: an unknown rule.
    """
    if off and rules is not None:
        raise click.UsageError("give --firewall or --no-firewall, not both")
    if off:
        return []
    if rules is None:
        return None
    names = [name.strip() for name in rules.split(",") if name.strip()]
    known = {rule.value for rule in ALL_FIREWALL_RULES}
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown rule {', '.join(unknown) or '(none given)'}; the rules: "
            f"{', '.join(sorted(known))}",
            param_hint="--firewall",
        )
    return names


def firewall_line(report: FirewallReport) -> str:
    """What the firewall removed, in one line for stderr."""
    if not report.rules:
        return "the semantic firewall is off"
    count = sum(report.removed.values())
    if not count and not report.removed_chars:
        return "the semantic firewall removed nothing"
    each = ", ".join(f"{rule} {n}" for rule, n in sorted(report.removed.items()) if n)
    return (
        f"the semantic firewall removed {count} element{'s' if count != 1 else ''} and "
        f"{report.removed_chars} characters of text ({each})"
    )


def _pairs(items: Sequence[str], separator: str, option: str) -> dict[str, str]:
    found = {}
    for item in items:
        name, sep, value = item.partition(separator)
        if not sep or not name.strip():
            raise click.BadParameter(f"takes NAME{separator}VALUE, got {item!r}", param_hint=option)
        found[name.strip()] = value.strip() if separator == ":" else value
    return found


@dataclass(frozen=True)
class _Output:
    """What the command prints: one text format on stdout (or the whole result as JSON),
    and the screenshot's file."""

    text: str  # a key of _TEXT_FORMATS
    as_json: bool
    screenshot: Path | None
    full_page: bool

    def formats(self, chosen: Sequence[str]) -> list[str]:
        formats = list(chosen) or [self.text]
        if self.screenshot is not None:
            formats.append("screenshot@full_page" if self.full_page else "screenshot")
        return formats


def _output(
    chosen: Sequence[str], as_json: bool, screenshot: Path | None, full_page: bool
) -> _Output:
    if full_page and screenshot is None:
        raise click.UsageError("--full-page goes with --screenshot FILE")
    if len(chosen) > 1 and not as_json:
        raise click.UsageError(
            "give one of --markdown, --html, --raw-html, --links (or several with --json)"
        )
    return _Output(chosen[0] if chosen else "markdown", as_json, screenshot, full_page)


@click.command("browse")
@click.argument("url", required=False)
@click.option("--markdown", is_flag=True, help="Print the Markdown (the default).")
@click.option(
    "--html", is_flag=True,
    help="Print the cleaned HTML (after the firewall and main-content pruning).",
)  # fmt: skip
@click.option("--raw-html", is_flag=True, help="Print the page's HTML as rendered, untouched.")
@click.option("--links", is_flag=True, help="Print the page's links, one absolute URL a line.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
@click.option(
    "--screenshot", type=click.Path(dir_okay=False, path_type=Path),
    help="Save a PNG screenshot of the final page (the viewport) here.",
)  # fmt: skip
@click.option("--full-page", is_flag=True, help="With --screenshot: the whole page.")
@click.option(
    "--action", "action_texts", multiple=True, metavar="JSON",
    help='An action before the capture, e.g. \'{"type": "click", "selector": "#go"}\' '
    "(repeatable, done in order).",
)  # fmt: skip
@click.option(
    "--actions", "actions_file", type=click.File("r"), metavar="FILE",
    help="A JSON list of actions (- for stdin), done after the --action ones.",
)  # fmt: skip
@click.option(
    "--wait-for", type=click.IntRange(0, 60_000), default=0, metavar="MS",
    help="Milliseconds to wait after the page loads.",
)  # fmt: skip
@click.option(
    "--timeout", type=click.FloatRange(1, 300), default=30.0, show_default=True,
    metavar="SECONDS", help="Seconds for the whole call, actions included.",
)  # fmt: skip
@click.option(
    "--no-main-only", is_flag=True,
    help="Keep navigation, headers, footers and asides (by default only the main content).",
)  # fmt: skip
@click.option(
    "--firewall", "firewall_rules", metavar="RULES",
    help="The semantic firewall's rules, comma-separated (default: all of "
    + ", ".join(rule.value for rule in ALL_FIREWALL_RULES) + ").",
)  # fmt: skip
@click.option("--no-firewall", is_flag=True, help="Turn the semantic firewall off.")
@click.option(
    "--header", "header_texts", multiple=True, metavar="'NAME: VALUE'",
    help="An extra header for the page's requests (repeatable).",
)  # fmt: skip
@click.option(
    "--cookie", "cookie_texts", multiple=True, metavar="NAME=VALUE",
    help="A cookie for the page's site, set before it loads (repeatable).",
)  # fmt: skip
@click.option(
    "--sandbox", "sandbox_id", metavar="ID",
    help="Use the browser of this sandbox (a session: it stays open; without URL, act on "
    "its open page) instead of a one-shot sandbox.",
)  # fmt: skip
@click.option("--api-key", envvar="RINGFENCE_API_KEY", show_envvar=True, help="Your API key.")
@click.option(
    "--url", "server", envvar="RINGFENCE_URL", show_envvar=True,
    help="The server [default: http://127.0.0.1:8080].",
)  # fmt: skip
def browse(
    url: str | None,
    markdown: bool,
    html: bool,
    raw_html: bool,
    links: bool,
    as_json: bool,
    screenshot: Path | None,
    full_page: bool,
    action_texts: tuple[str, ...],
    actions_file: IO[str] | None,
    wait_for: int,
    timeout: float,
    no_main_only: bool,
    firewall_rules: str | None,
    no_firewall: bool,
    header_texts: tuple[str, ...],
    cookie_texts: tuple[str, ...],
    sandbox_id: str | None,
    server: str | None,
    api_key: str | None,
) -> None:
    """Render URL in a real Chromium inside a sandbox and print its Markdown.

    What a person would not see (hidden, off-screen, zero-size, same-colour text, scripts,
    comments) is left out by the semantic firewall, which says on stderr how much it
    removed. Everything printed is the page's: untrusted content. Without --sandbox, the
    page renders in a one-shot sandbox of the server's browser template, reaching only what
    your tenant's egress policy allows.

    \b
    Examples:
      ringfence browse https://example.com
      ringfence browse https://example.com --links --screenshot page.png --full-page
      ringfence browse http://app.test/login --sandbox SBX \\
        --action '{"type": "click", "selector": "#user"}' \\
        --action '{"type": "write", "text": "alice"}' \\
        --action '{"type": "press", "key": "Enter"}' \\
        --action '{"type": "wait", "selector": "#welcome"}'
    """
    flags = {"markdown": markdown, "html": html, "raw_html": raw_html, "links": links}
    chosen = [name for name, given in flags.items() if given]
    output = _output(chosen, as_json, screenshot, full_page)
    if url is None and sandbox_id is None:
        raise click.UsageError("give a URL (or --sandbox ID to act on its open page)")
    arguments: dict[str, Any] = {
        "formats": output.formats(chosen),
        "actions": read_actions(action_texts, actions_file),
        "only_main_content": not no_main_only,
        "wait_for": wait_for,
        "timeout": round(timeout * 1000),
        "headers": _pairs(header_texts, ":", "--header"),
        "cookies": [
            {"name": n, "value": v} for n, v in _pairs(cookie_texts, "=", "--cookie").items()
        ],
        "firewall": parse_firewall(firewall_rules, no_firewall),
    }
    with client_errors():
        result = _scrape(url, sandbox_id, arguments, server, api_key)
    _print(result, output)


def _scrape(
    url: str | None,
    sandbox_id: str | None,
    arguments: dict[str, Any],
    server: str | None,
    api_key: str | None,
) -> ScrapeResult:
    from ringfence.client import Ringfence, Sandbox

    if sandbox_id is None:
        assert url is not None  # checked by the command
        with Ringfence(server, api_key) as rf:
            return rf.browser.scrape(url, **arguments)
    sbx = Sandbox.connect(sandbox_id, url=server, api_key=api_key)
    try:
        return sbx.browser.scrape(url, **arguments)
    finally:
        sbx.close()


def _print(result: ScrapeResult, output: _Output) -> None:
    from ringfence.client import decode_png

    if output.screenshot is not None and result.screenshot is not None:
        with client_errors():
            png = decode_png(result)
        output.screenshot.write_bytes(png)
        click.echo(f"ringfence: saved {output.screenshot} ({len(png)} bytes)", err=True)
    if output.as_json:
        click.echo(result.model_dump_json(indent=2))
    elif output.text == "links":
        for link in result.links or []:
            click.echo(link)
    else:
        text = getattr(result, _TEXT_FORMATS[output.text]) or ""
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        sys.stdout.flush()
    if result.markdown is not None or result.html is not None:  # what the firewall filters
        click.echo(f"ringfence: {firewall_line(result.firewall)}", err=True)
    if result.metadata.error is not None:
        fail(f"the page did not load: {result.metadata.error}", 1)
    if output.screenshot is not None and result.screenshot is None:
        fail("the browser sent no screenshot", 1)
