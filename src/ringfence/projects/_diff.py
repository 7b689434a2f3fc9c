"""Changes as the API shows them: a unified diff for each text file (host first, sandbox
second), and why none is shown otherwise (binary, too large, unreadable on the host, the
response's cap reached).

difflib's work grows with the product of the two sides' differing lines (the lines left
once the common head and tail are set aside), and both sides may be the sandbox's: a
file whose adjacent lines are swapped made a 75 KB file cost 83 s. So that product is
bounded before anything is computed, per file (``MAX_DIFF_WORK``) and per answer
(``MAX_ANSWER_WORK``), and no diff is computed once the answer's text cap is reached: a
diff past a bound is not shown ("too large to show"), its change still listed."""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Iterable

from ringfence.models import ProjectChange
from ringfence.projects import _fs
from ringfence.projects._changes import REPLACES_DIR, Change, Owner, shown_name
from ringfence.projects._sensitive import is_sensitive

__all__ = ["MAX_ANSWER_WORK", "MAX_DIFF_BYTES", "MAX_DIFF_WORK", "MAX_TEXT_BYTES", "render"]

MAX_TEXT_BYTES = 1 << 20  # a file larger than this on either side gets no diff
MAX_DIFF_BYTES = 8 << 20  # diffs of one answer, together
# Differing lines before x after, for one file and for one answer's files together
# (difflib's worst case is about 0.4 s of one core per million, measured on this host).
MAX_DIFF_WORK = 2_000_000
MAX_ANSWER_WORK = 10_000_000
_CAP_NOTE = "left out: the answer's diffs reached their cap"


def render(
    changes: Iterable[Change], upper_fd: int, host_fd: int, owner: Owner
) -> tuple[list[ProjectChange], bool]:
    """The changes with their diffs, and whether some diff was left out for the cap."""
    with _fs.DirChain(upper_fd) as upper_dirs, _fs.DirChain(host_fd) as host_dirs:
        return _render(changes, upper_dirs, host_dirs, owner)


def _render(
    changes: Iterable[Change], upper_dirs: _fs.DirChain, host_dirs: _fs.DirChain, owner: Owner
) -> tuple[list[ProjectChange], bool]:
    shown: list[ProjectChange] = []
    budget = _Budget()
    truncated = False
    for change in changes:
        text, binary, note = None, False, change.note
        if change.kind == "file" and note in (None, REPLACES_DIR):
            why: str | None
            if budget.spent:  # nothing more is computed once the answer is full
                why, truncated = _CAP_NOTE, True
            else:
                text, binary, why = _file_diff(change, upper_dirs, host_dirs, owner, budget)
                if text is not None and len(text) > budget.text:
                    text, why, truncated = None, _CAP_NOTE, True
                    budget.text = 0  # full: later diffs are not computed to be dropped
                budget.text -= len(text or "")
            note = note or why
        upper = change.upper
        shown.append(
            ProjectChange(
                path=change.path,
                action=change.action,
                kind=change.kind,
                mode=stat.S_IMODE(upper.st_mode) if upper is not None else None,
                size=upper.st_size if upper is not None and change.kind == "file" else None,
                target=None if change.target is None else shown_name(change.target),
                binary=binary,
                diff=text,
                note=note,
                sensitive=is_sensitive(change.parts),
            )
        )
    return shown, truncated


class _Budget:
    """What one answer may still take: diff text, and difflib's work."""

    def __init__(self) -> None:
        self.text = MAX_DIFF_BYTES
        self.work = MAX_ANSWER_WORK

    @property
    def spent(self) -> bool:
        return self.text <= 0 or self.work <= 0


def _differing(old: list[str], new: list[str]) -> tuple[int, int]:
    """The lines of each side left once the common head and tail are set aside (linear to
    find): difflib's work is bounded above by their product."""
    head = 0
    for mine, theirs in zip(old, new, strict=False):
        if mine != theirs:
            break
        head += 1
    tail = 0
    for mine, theirs in zip(reversed(old[head:]), reversed(new[head:]), strict=False):
        if mine != theirs:
            break
        tail += 1
    return len(old) - head - tail, len(new) - head - tail


def _file_diff(
    change: Change, upper: _fs.DirChain, host: _fs.DirChain, owner: Owner, budget: _Budget
) -> tuple[str | None, bool, str | None]:
    """(diff, binary, note) of one file change."""
    sizes = [st.st_size for st in (change.host, change.upper) if st is not None]
    if any(size > MAX_TEXT_BYTES for size in sizes):
        return None, False, f"larger than {MAX_TEXT_BYTES} bytes: no diff shown"
    before = b""
    if change.host is not None and stat.S_ISREG(change.host.st_mode):
        if not owner.may_read(change.host):
            return None, False, "the host's file is not readable by the directory's owner"
        got = _read(host, change.parts, change.host)
        if got is None:
            return None, False, "the host's file changed while it was read"
        before = got
    after = b""
    if change.upper is not None and stat.S_ISREG(change.upper.st_mode):
        got = _read(upper, change.parts, change.upper)
        if got is None:
            return None, False, "the sandbox's file changed while it was read"
        after = got
    old, new = _text(before), _text(after)
    if old is None or new is None:
        return None, True, "binary file"
    deleted, added = change.action == "deleted", change.action == "added"
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    old_left, new_left = _differing(old_lines, new_lines)
    work = old_left * new_left
    if work > MAX_DIFF_WORK:
        why = f"{old_left} x {new_left} differing lines, more than {MAX_DIFF_WORK} pairs to compare"
        return None, False, f"diff too large to show: {why}"
    if work > budget.work:
        return None, False, _CAP_NOTE
    budget.work -= work
    lines = difflib.unified_diff(
        old_lines,
        new_lines,
        fromfile="/dev/null" if added else f"a/{change.path}",
        tofile="/dev/null" if deleted else f"b/{change.path}",
    )
    return "".join(_ended(lines)), False, None


def _read(dirs: _fs.DirChain, parts: tuple[str, ...], expect: os.stat_result) -> bytes | None:
    try:
        with _fs.opened_file(dirs.open(parts[:-1]), parts[-1], expect) as fd:
            return _fs.read_head(fd, MAX_TEXT_BYTES + 1)
    except OSError:
        return None


def _text(data: bytes) -> str | None:
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _ended(lines: Iterable[str]) -> Iterable[str]:
    """Lines of a diff, a file's last line without a newline marked as ``diff`` does."""
    for line in lines:
        if line.endswith("\n"):
            yield line
        else:
            yield line + "\n\\ No newline at end of file\n"
