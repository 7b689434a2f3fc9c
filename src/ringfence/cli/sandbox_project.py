"""``ringfence sandbox diff|sync``: a sandbox's project view (``sandbox create --project
DIR``), through the SDK: what the sandbox changed in its copy-on-write view of a host
directory, and applying chosen changes to that directory (docs/design.md 14.7)."""

from __future__ import annotations

import re
import sys

import click

from ringfence.cli.sandbox import api_options, client_errors
from ringfence.models import ProjectChange, ProjectDiff, ProjectSyncReport

__all__ = ["COMMANDS", "printable", "render_diff", "render_stat"]

_LETTERS = {"added": "A", "modified": "M", "deleted": "D"}
# What a terminal would act on instead of showing: C0 controls but newline and tab, a
# carriage return not ending a line, DEL, C1 controls, line and paragraph separators and
# bidirectional overrides (an escape sequence, a '\r' or a reordering can hide a line).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]|\r(?!\n)")
_SENSITIVE_NOTE = "sensitive, the host runs or trusts it (sync needs --include-sensitive)"


@click.command("diff")
@click.argument("sandbox_id")
@click.option("--stat", "as_stat", is_flag=True, help="One line per change with its +/- counts.")
@click.option("--name-only", is_flag=True, help="Only the changed paths.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole diff as JSON.")
@api_options
def diff(
    sandbox_id: str,
    as_stat: bool,
    name_only: bool,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """What the sandbox changed in its project view (added, modified, deleted), as a
    unified diff for text files. The host directory is unchanged until 'sandbox sync'."""
    from ringfence.client import Sandbox

    with client_errors():
        sbx = Sandbox.connect(sandbox_id, url=url, api_key=api_key)
        try:
            found = sbx.project.diff()
        finally:
            sbx.close()
    if as_json:
        click.echo(found.model_dump_json(indent=2))
    elif name_only:
        for change in found.changes:
            click.echo(printable(change.path))
    elif as_stat:
        click.echo(printable(render_stat(found)), nl=False)
    else:
        click.echo(printable(render_diff(found)), nl=False)


@click.command("sync")
@click.argument("sandbox_id")
@click.argument("paths", nargs=-1)
@click.option(
    "--include-sensitive",
    is_flag=True,
    help="Also apply the sensitive changes (marked '!' by diff and diff --stat: .git, "
    ".envrc, editor and shell configuration, which the host runs) that PATHS name themselves.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@api_options
def sync(
    sandbox_id: str,
    paths: tuple[str, ...],
    include_sensitive: bool,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Apply the sandbox's changes to the host directory: all of them, or those at or
    below PATHS (relative to the project). Links out of the project, special files and
    setuid files are refused; so are paths the host runs or trusts (.git, .envrc,
    .vscode, shell start files...), unless --include-sensitive is given and PATHS name
    them. The exit status is 1 when anything was refused.

    \b
    Example (review, then take two files):
      ringfence sandbox diff sb0123 --stat
      ringfence sandbox sync sb0123 src/app.py tests/test_app.py
      ringfence sandbox sync sb0123 --include-sensitive .vscode/settings.json
    """
    from ringfence.client import Sandbox

    with client_errors():
        sbx = Sandbox.connect(sandbox_id, url=url, api_key=api_key)
        try:
            report = sbx.project.sync(
                list(paths) if paths else None, include_sensitive=include_sensitive
            )
        finally:
            sbx.close()
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        click.echo(printable(render_report(report)), nl=False)
    if report.refused:
        sys.exit(1)


def printable(text: str) -> str:
    """``text`` with what a terminal would act on written ``\\uNNNN`` (names come escaped
    from the server already, ``shown_name``; a diff's lines are the files' own text)."""
    return _CONTROL.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def render_diff(found: ProjectDiff) -> str:
    """The changes as ``git diff`` shows them: each text file's unified diff, and a line
    for what has none (directories, links, binary files, mode changes)."""
    out = []
    for change in found.changes:
        if change.sensitive:
            out.append(f"! {_SENSITIVE_NOTE}: {change.path}\n")
        if change.diff:
            out.append(change.diff)
        described = _described(change)
        if described:
            out.append(described + "\n")
    if found.truncated:
        out.append("(some diffs were left out: the answer reached the server's cap)\n")
    return "".join(out)


def render_stat(found: ProjectDiff) -> str:
    """One line per change: its letter, path and +/- counts; then the totals."""
    lines, added, removed = [], 0, 0
    for change in found.changes:
        plus, minus = _counts(change.diff or "")
        added, removed = added + plus, removed + minus
        counts = f" | +{plus} -{minus}" if change.diff else ""
        suffix = "/" if change.kind == "dir" else ""
        flag = "!" if change.sensitive else " "
        lines.append(f"{_LETTERS[change.action]}{flag}{change.path}{suffix}{counts}\n")
    lines.append(f"{len(found.changes)} changed, {added} insertions(+), {removed} deletions(-)\n")
    return "".join(lines)


def render_report(report: ProjectSyncReport) -> str:
    lines = [f"{_LETTERS[c.action]} {c.path}\n" for c in report.applied]
    lines += [f"refused {r.path}: {r.reason}\n" for r in report.refused]
    lines.append(f"{len(report.applied)} applied, {len(report.refused)} refused\n")
    return "".join(lines)


def _described(change: ProjectChange) -> str:
    """A line for a change its diff does not show (empty when the diff says it all)."""
    if change.kind == "dir":
        return f"{change.action} directory {change.path}/"
    if change.kind == "symlink":
        target = f" -> {change.target}" if change.target is not None else ""
        return f"{change.action} link {change.path}{target}"
    if change.kind == "other":
        return f"{change.action} special file {change.path} (never synced)"
    if change.binary:
        verb = "differs" if change.action == "modified" else change.action
        return f"Binary file {change.path} {verb}"
    if change.note:
        return f"{change.action} {change.path}: {change.note}"
    if not change.diff and change.action == "modified" and change.mode is not None:
        return f"mode of {change.path} is now {change.mode:04o}"
    if not change.diff:
        return f"{change.action} {change.path} (empty)"
    return ""


def _counts(text: str) -> tuple[int, int]:
    plus = minus = 0
    for line in text.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            plus += 1
        elif line.startswith("-") and not line.startswith("---"):
            minus += 1
    return plus, minus


# What ``ringfence sandbox`` gains (``ringfence.cli`` adds them to the group).
COMMANDS = [diff, sync]
