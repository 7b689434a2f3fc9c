"""``ringfence audit``: export the audit log, verify an export offline, read its tail.

``export`` and ``tail`` open the store as ``ringfence keys`` does (``--data-dir``,
``--database-url``, through ``ringfence.compose.open_offline``); ``verify`` reads nothing but
the file it checks. Exit status: 0 done (or the export verified); 1 the export failed
verification, or the store or log failed; 2 the input cannot be used (no database, an
unreadable file, a malformed key).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import click

from ringfence.cli._common import fail, settings
from ringfence.config import Config
from ringfence.errors import RingfenceError

if TYPE_CHECKING:
    from ringfence.audit.chain import AuditRecord
    from ringfence.audit.signing import SealKey
    from ringfence.audit.verify import Problem, Verdict
    from ringfence.models import AuditQuery
    from ringfence.service.audit import AuditRecords

__all__ = ["audit"]

EXIT_FAILED = 1
EXIT_UNUSABLE = 2
EXIT_INTERRUPTED = 130
_PAGE = 1000
_FOLLOW_SECONDS = 1.0

_store_options = [
    click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="The server's data directory (its database and seal key), as for 'ringfence serve'.",
    ),
    click.option(
        "--database-url", help="As for 'ringfence serve' (default: SQLite in --data-dir)."
    ),
]


_F = TypeVar("_F", bound=Callable[..., Any])


def _with_store_options(command: _F) -> _F:
    for option in reversed(_store_options):
        command = option(command)
    return command


@click.group()
def audit() -> None:
    """The tamper-evident audit log: export it, verify an export, read the newest records.

    Every record is hash-chained to the one before it; seals sign the chain's head with the
    server's Ed25519 key (<data dir>/audit-seal-key). See docs/audit.md.
    """


# --- export -------------------------------------------------------------------------------


@audit.command("export")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="Write the export here (replaced whole at the end), or - for stdout.",
)
@_with_store_options
def export(out: Path, data_dir: Path | None, database_url: str | None) -> None:
    """Seal the log now, then write every record (all tenants) up to that seal to FILE.

    The export is JSON lines, oldest first, and ends with the seal just made, so that
    'ringfence audit verify' can tell that nothing was cut off its end. Records appended by a
    running server meanwhile are left for the next export. Needs the server's seal key: run
    it with the server's --data-dir. A summary goes to stderr.
    """
    config = settings(data_dir=data_dir, database_url=database_url)
    _require_database(config)
    try:
        summary = asyncio.run(_export(config, out))
    except RingfenceError as exc:
        fail(exc.message, EXIT_UNUSABLE if exc.code == "invalid_request" else EXIT_FAILED)
    except _Unusable as exc:
        fail(str(exc), EXIT_UNUSABLE)
    except _LogFailed as exc:
        fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        fail(f"interrupted; {out} was not written", EXIT_INTERRUPTED)
    where = "stdout" if str(out) == "-" else str(out)
    click.echo(
        f"ringfence: exported {summary.records} records ({summary.seals} seals) to {where}; "
        f"it ends with seal {summary.seal_seq} at {summary.seal_at}",
        err=True,
    )
    click.echo(f"ringfence: seal key (pin it to verify): {summary.public_key}", err=True)


class _Unusable(Exception):
    """The input cannot be used (exit 2)."""


class _LogFailed(Exception):
    """The log cannot be exported as it is (exit 1)."""


@dataclass(frozen=True)
class _Summary:
    records: int
    seals: int
    seal_seq: int
    seal_at: str
    public_key: str


async def _export(config: Config, out: Path) -> _Summary:
    from ringfence.audit.chain import SEAL_ACTION
    from ringfence.compose import open_offline
    from ringfence.models import AuditQuery

    async with open_offline(config) as offline:
        log = offline.audit
        key = await _seal_key_for(log, config.data_dir)
        seal = await log.seal(key)
        records = seals = after = 0
        with _output(out) as file:
            while after < seal.seq:
                page = await log.query(AuditQuery(after_seq=after, limit=_PAGE))
                # Stop at the seal made above: what a server appended since is not covered.
                for record in page:
                    if record.seq > seal.seq:
                        break
                    file.write(record.line() + "\n")
                    records += 1
                    seals += record.action == SEAL_ACTION
                if not page:
                    break
                after = page[-1].seq
        return _Summary(records, seals, seal.seq, seal.at, key.public_key)


async def _seal_key_for(log: AuditRecords, data_dir: Path) -> SealKey:
    """The data directory's seal key, refusing one that did not make the log's first seal: a
    seal by another key would make every export of this log fail verification for good.

    Raises:
        _LogFailed: the log was first sealed by another key, or there is no key here for it.
        _Unusable: the key file cannot be read.
    """
    from ringfence.audit.chain import SEAL_ACTION
    from ringfence.audit.signing import KEY_FILE, SealKey
    from ringfence.models import AuditQuery

    first = await log.query(AuditQuery(action=SEAL_ACTION, limit=1))
    sealed_by = first[0].details.get("public_key") if first else None
    path = data_dir / KEY_FILE
    if sealed_by is not None and not path.exists():
        raise _LogFailed(
            f"no seal key in {data_dir}, but the log is sealed with {sealed_by}: "
            "run this with the server's --data-dir"
        )
    try:
        key = SealKey.load_or_create(data_dir)
    except (OSError, ValueError) as exc:
        raise _Unusable(f"cannot read the seal key {path}: {exc}") from exc
    if sealed_by is not None and sealed_by != key.public_key:
        raise _LogFailed(
            f"the seal key in {data_dir} ({key.public_key}) is not the one that sealed this log "
            f"({sealed_by}): run this with the server's --data-dir"
        )
    return key


@contextlib.contextmanager
def _output(out: Path) -> Iterator[TextIO]:
    """Stdout for ``-``; else a temporary file beside ``out`` (owner-only: records may name
    commands and paths), renamed over it only when everything was written."""
    if str(out) == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    try:
        descriptor, temporary = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    except OSError as exc:
        raise _Unusable(f"cannot write {out}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, out)
    except OSError as exc:
        raise _Unusable(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _require_database(config: Config) -> None:
    """A mistyped --data-dir must not quietly create an empty log to export or tail."""
    database = config.data_dir / "ringfence.db"
    if config.database_url is None and not database.exists():
        fail(
            f"no Ringfence database in {config.data_dir} (give the server's --data-dir "
            "or --database-url)",
            EXIT_UNUSABLE,
        )


# --- verify -------------------------------------------------------------------------------


@audit.command("verify")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option(
    "--public-key",
    help="The server's seal key (base64; 'ringfence audit public-key' prints it). Without it, "
    "the key in the file's first seal is trusted, so a file rewritten whole would pass.",
)
@click.option(
    "--min-seq",
    type=click.IntRange(min=1),
    help="Fail unless the export reaches at least this sequence number (e.g. the seal seq an "
    "earlier export printed): catches an end cut off exactly at an older seal.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON on stdout.")
def verify(file: Path, public_key: str | None, min_seq: int | None, as_json: bool) -> None:
    """Check an export offline (no store, no server): FILE, or - for stdin.

    Checks that every record follows the one before it (sequence and hash chain), that its
    content matches its hash, that every seal's signature verifies, and that the export ends
    with a seal. Prints OK with counts, or the first bad record's line and why.

    Exit status: 0 verified; 1 it failed verification; 2 the file cannot be read, is not an
    audit export, or the key is malformed.
    """
    from ringfence.audit.signing import parse_public_key
    from ringfence.errors import InvalidRequest

    if public_key is not None:
        try:  # a well-formed key just fails to check this empty seal; a malformed one raises
            parse_public_key(public_key)
        except InvalidRequest as exc:
            fail(f"--public-key: {exc.message}", EXIT_UNUSABLE)
    try:
        with _opened(file) as source:
            lines = _Lines(source)
            verdict = _verdict(lines, public_key)
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror or exc}", EXIT_UNUSABLE)
    except KeyboardInterrupt:
        fail("interrupted; nothing was verified", EXIT_INTERRUPTED)
    problem = verdict.problem
    if problem is not None and problem.line == 1 and problem.seq is None:
        fail(f"{file} is not an audit export: line 1: {problem.reason}", EXIT_UNUSABLE)
    if problem is None and min_seq is not None and (verdict.last_seal_seq or 0) < min_seq:
        problem = _problem(
            lines.count + 1,
            f"the export ends at sequence {verdict.last_seal_seq}, before the expected "
            f"{min_seq}: records were cut off its end (at a seal)",
        )
        verdict = replace(verdict, problem=problem)
    if as_json:
        click.echo(json.dumps(_verdict_json(verdict), indent=2))
    if problem is None:
        if not as_json:
            _print_ok(verdict)
        return
    last = problem.line > lines.count
    where = f"after the last line ({lines.count})" if last else f"at line {problem.line}"
    seq = f" (seq {problem.seq})" if problem.seq is not None else ""
    fail(f"{file}: verification FAILED {where}{seq}: {problem.reason}", EXIT_FAILED)


class _Lines:
    """The lines of a binary file, decoded leniently (a bad byte fails that record's hash,
    not the reading), counted: the count is the line being checked when something raises."""

    def __init__(self, source: Iterator[bytes]) -> None:
        self._source = source
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        for raw in self._source:
            self.count += 1
            yield raw.decode("utf-8", errors="replace")


def _verdict(lines: _Lines, public_key: str | None) -> Verdict:
    from ringfence.audit.verify import verify_export

    return verify_export(lines, public_key)  # the pinned key was checked before


def _problem(line: int, reason: str) -> Problem:
    from ringfence.audit.verify import Problem

    return Problem(line, None, reason)


@contextlib.contextmanager
def _opened(file: Path) -> Iterator[Iterator[bytes]]:
    if str(file) == "-":
        yield iter(sys.stdin.buffer)
        return
    with file.open("rb") as source:
        yield iter(source)


def _verdict_json(verdict: Verdict) -> dict[str, Any]:
    problem = verdict.problem
    return {
        "ok": problem is None,
        "records": verdict.records,
        "seals": verdict.seals,
        "last_seal_seq": verdict.last_seal_seq,
        "last_seal_at": verdict.last_seal_at,
        "public_key": verdict.public_key,
        "pinned": verdict.pinned,
        "problem": None
        if problem is None
        else {"line": problem.line, "seq": problem.seq, "reason": problem.reason},
    }


def _print_ok(verdict: Verdict) -> None:
    click.echo(
        f"OK: {verdict.records} records, {verdict.seals} seals; the chain is whole and ends "
        f"with seal {verdict.last_seal_seq} at {verdict.last_seal_at}"
    )
    if verdict.pinned:
        click.echo(f"seals checked against the pinned key {verdict.public_key}")
    else:
        click.echo(
            f"seals checked against {verdict.public_key}, the key TAKEN FROM THE FILE (not "
            "pinned): a file rewritten whole with another key would pass too; pin the "
            "server's key with --public-key"
        )


# --- public-key ---------------------------------------------------------------------------


@audit.command("public-key")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The server's data directory, as for 'ringfence serve'.",
)
def public_key(data_dir: Path | None) -> None:
    """Print the public key that checks the log's seals (base64 Ed25519).

    Pin it for 'ringfence audit verify --public-key', and keep it apart from the server.
    The key pair is <data dir>/audit-seal-key, made here if there is none yet.
    """
    from ringfence.audit.signing import KEY_FILE, SealKey

    config = settings(data_dir=data_dir)
    try:
        key = SealKey.load_or_create(config.data_dir)
    except (OSError, ValueError) as exc:
        fail(f"cannot read the seal key {config.data_dir / KEY_FILE}: {exc}", EXIT_UNUSABLE)
    click.echo(key.public_key)


# --- tail ---------------------------------------------------------------------------------


@audit.command("tail")
@click.option(
    "-n",
    "--lines",
    "count",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="How many of the newest records to print.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new records until Ctrl-C.")
@click.option("--tenant", help="Only this tenant's records ('' for the installation's own).")
@click.option("--action", help="Only this action, or a prefix ending with '.' (sandbox.).")
@click.option("--json", "as_json", is_flag=True, help="Print each record as its JSON line.")
@_with_store_options
def tail(
    count: int,
    follow: bool,
    tenant: str | None,
    action: str | None,
    as_json: bool,
    data_dir: Path | None,
    database_url: str | None,
) -> None:
    """Print the newest records from the store, oldest of them first.

    One line each: seq, time (UTC), tenant ('-' for the installation), actor, action,
    target, outcome. --json prints the records as an export holds them. This reads the
    store; it checks nothing: verify an export for that.
    """
    from ringfence.models import AuditQuery

    config = settings(data_dir=data_dir, database_url=database_url)
    _require_database(config)
    query = AuditQuery(tenant=tenant, action=action)
    show = _json_line if as_json else _human_line
    try:
        asyncio.run(_tail(config, query, count, follow, show))
    except KeyboardInterrupt:
        pass  # how --follow ends
    except BrokenPipeError:  # | head: the reader has what it wanted
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except RingfenceError as exc:
        fail(exc.message, EXIT_UNUSABLE if exc.code == "invalid_request" else EXIT_FAILED)


async def _tail(
    config: Config,
    query: AuditQuery,
    count: int,
    follow: bool,
    show: Callable[[AuditRecord], str],
) -> None:
    from ringfence.compose import open_offline

    async with open_offline(config) as offline:
        log = offline.audit
        head = await _head(log)
        for record in await _newest(log, query, head, count):
            click.echo(show(record))
        after = head
        while follow:
            page = await log.query(replace(query, after_seq=after, limit=_PAGE))
            for record in page:
                click.echo(show(record))
            if page:
                after = page[-1].seq
            else:
                await asyncio.sleep(_FOLLOW_SECONDS)


async def _head(log: AuditRecords) -> int:
    """The last sequence number (0 for an empty log): found by probing, as the store lists
    oldest first only. Each probe is one indexed query."""
    from ringfence.models import AuditQuery

    async def any_after(seq: int) -> bool:
        return bool(await log.query(AuditQuery(after_seq=seq, limit=1)))

    if not await any_after(0):
        return 0
    low, high = 0, 1  # invariant: records after low, none after high (once found)
    while await any_after(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if await any_after(middle):
            low = middle
        else:
            high = middle
    return high


async def _newest(log: AuditRecords, query: AuditQuery, head: int, count: int) -> list[AuditRecord]:
    """The last ``count`` records matching ``query`` up to ``head``: read from a window before
    the head that grows until it holds enough (seqs are unique, so a window of w seqs holds
    at most w records and ``limit=w`` reads all of it)."""
    if count == 0 or head == 0:
        return []
    window = max(count, 100)
    while True:
        start = max(head - window, 0)
        page = await log.query(replace(query, after_seq=start, limit=window))
        found = [record for record in page if record.seq <= head]
        if len(found) >= count or start == 0:
            return found[-count:]
        window *= 4


def _json_line(record: AuditRecord) -> str:
    return record.line()


def _human_line(record: AuditRecord) -> str:
    at = record.at[:19].replace("T", " ") + "Z"  # to the second: the JSON has the rest
    return (
        f"{record.seq:>7}  {at}  {record.tenant or '-'}  {record.actor}  {record.action}  "
        f"{record.target}  {record.outcome}"
    )
