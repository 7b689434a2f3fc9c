"""``SqlStore`` on SQLite and on a real PostgreSQL: the store contract, and what SQL adds
(persistence, migrations, concurrent starts, private files, errors at the boundary)."""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys
from asyncio.subprocess import PIPE
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from ringfence.errors import StoreError
from ringfence.models import ApiKey, ExecutionRequest, ExecutionResult, Role, Status
from ringfence.store import SqlStore
from ringfence.store.migrations import VERSION_TABLE
from ringfence.store.sql import METADATA
from ringfence.testing.store_checks import STORE_CHECKS, StoreCheck

T = TypeVar("T")
HEAD = "0009"


def _request(execution_id: str) -> ExecutionRequest:
    return ExecutionRequest(id=execution_id, command=["true"])


def _result(execution_id: str, status: Status = Status.PENDING) -> ExecutionResult:
    return ExecutionResult(execution_id=execution_id, status=status)


def _key(key_id: str, created_at: datetime) -> ApiKey:
    return ApiKey(key_id, "acme", Role.APPROVER, "cd" * 32, created_at, "on call")


async def _on_connection(url: str, work: Callable[[sa.Connection], T]) -> T:
    """Run ``work`` in a transaction on the database, outside any store."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            return await connection.run_sync(work)
    finally:
        await engine.dispose()


def _revision(connection: sa.Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """Every SQL statement that any engine sends while the test runs."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    sa.event.listen(sa.Engine, "before_cursor_execute", record)
    yield sent
    sa.event.remove(sa.Engine, "before_cursor_execute", record)


@pytest.mark.parametrize("check", STORE_CHECKS, ids=lambda c: c.__name__)
async def test_the_sql_store_meets_the_contract(database: str, check: StoreCheck) -> None:
    store = await SqlStore.open(database)
    try:
        await check(store)
    finally:
        await store.aclose()


async def test_data_survives_closing_and_reopening(database: str) -> None:
    created = datetime.now(UTC)
    store = await SqlStore.open(database)
    await store.add_key(_key("k1", created))
    await store.add_execution("acme", _request("e1"), _result("e1", Status.SUCCEEDED))
    await store.add_execution("acme", _request("e2"), _result("e2", Status.RUNNING))
    await store.aclose()

    store = await SqlStore.open(database)
    try:
        assert await store.get_key("k1") == _key("k1", created)
        assert [r.id for r in await store.list_executions("acme")] == ["e2", "e1"]
        record = await store.get_execution("acme", "e1")
        assert record is not None and record.result == _result("e1", Status.SUCCEEDED)
        assert record.request == _request("e1")
    finally:
        await store.aclose()


async def test_timestamps_come_back_aware_and_in_utc(database: str) -> None:
    created = datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
    store = await SqlStore.open(database)
    await store.add_key(_key("k1", created))
    await store.add_execution("acme", _request("e1"), _result("e1"))
    await store.aclose()

    store = await SqlStore.open(database)
    try:
        key = await store.get_key("k1")
        record = await store.get_execution("acme", "e1")
    finally:
        await store.aclose()
    assert key is not None and key.created_at == created and key.created_at.tzinfo is UTC
    assert record is not None
    for stamp in (record.created_at, record.updated_at):
        assert stamp.tzinfo is UTC and abs(datetime.now(UTC) - stamp) < timedelta(minutes=1)


async def test_migrating_an_up_to_date_database_changes_nothing(
    database: str, statements: list[str]
) -> None:
    await (await SqlStore.open(database)).aclose()
    assert await _on_connection(database, _revision) == HEAD

    statements.clear()
    store = await SqlStore.open(database)
    await store.aclose()
    assert await _on_connection(database, _revision) == HEAD
    writes = ("CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE")
    assert [s for s in statements if s.split()[0].upper() in writes] == []


async def test_the_migrations_make_the_schema_the_store_queries(database: str) -> None:
    await (await SqlStore.open(database)).aclose()

    def differences(connection: sa.Connection) -> list[object]:
        opts = {"version_table": VERSION_TABLE, "compare_type": True}
        return list(compare_metadata(MigrationContext.configure(connection, opts=opts), METADATA))

    assert await _on_connection(database, differences) == []


async def test_a_database_migrated_by_a_newer_ringfence_is_refused(database: str) -> None:
    await (await SqlStore.open(database)).aclose()

    def from_the_future(connection: sa.Connection) -> None:
        connection.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")

    await _on_connection(database, from_the_future)
    with pytest.raises(StoreError) as raised:
        await SqlStore.open(database)
    assert raised.value.code == "store_error"


async def test_stores_opening_at_once_on_different_databases_migrate_apart(
    tmp_path: Path,
) -> None:
    # Alembic keeps the migration it runs in module globals: one process runs one at a time.
    urls = [f"sqlite:///{tmp_path}/{i}/ringfence.db" for i in range(6)]
    stores = await asyncio.gather(*(SqlStore.open(url) for url in urls))
    await asyncio.gather(*(store.aclose() for store in stores))
    for url in urls:
        assert await _on_connection(url.replace("sqlite:", "sqlite+aiosqlite:"), _revision) == HEAD


_WRITER = """
import asyncio, sys
from ringfence.models import ExecutionRequest, ExecutionResult
from ringfence.store import SqlStore
import ringfence.store.sql  # imported before the start signal: all open the store at once

async def main(url, prefix, writes):
    store = await SqlStore.open(url)
    for i in range(writes):
        execution_id = f"{prefix}{i}"
        request = ExecutionRequest(id=execution_id, command=["true"])
        result = ExecutionResult(execution_id=execution_id, status="pending")
        await store.add_execution("acme", request, result)
    await store.aclose()

print("ready", flush=True)
sys.stdin.readline()
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""
WRITES = 20


async def _write_at_once(url: str, prefixes: str) -> None:
    """Start one process per prefix; when all are ready, let them open the store together."""
    writers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WRITER, url, prefix, str(WRITES), stdin=PIPE, stdout=PIPE
        )
        for prefix in prefixes
    ]
    try:
        for writer in writers:
            assert writer.stdout is not None and await writer.stdout.readline() == b"ready\n"
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write(b"go\n")
            await writer.stdin.drain()
        assert [await writer.wait() for writer in writers] == [0] * len(writers)
    finally:
        for writer in writers:
            if writer.returncode is None:
                writer.kill()
                await writer.wait()


async def test_processes_starting_at_once_share_one_database(database: str) -> None:
    # The schema does not exist yet: every process tries to create it at the same moment.
    # One does (PostgreSQL's advisory lock, SQLite's write lock); the others wait, then find
    # it done, and all write while the others write.
    await _write_at_once(database, "abc")
    store = await SqlStore.open(database)
    try:
        listed = await store.list_executions("acme", limit=1000)
    finally:
        await store.aclose()
    every = [f"{p}{i}" for p in "abc" for i in range(WRITES)]
    assert sorted(r.id for r in listed) == sorted(every)
    for prefix in "abc":  # each process's own rows, newest first
        mine = [r.id for r in listed if r.id.startswith(prefix)]
        assert mine == [f"{prefix}{i}" for i in reversed(range(WRITES))]


async def test_concurrent_calls_on_one_store_all_land(database: str) -> None:
    store = await SqlStore.open(database)
    try:
        ids = [f"e{i}" for i in range(30)]
        await asyncio.gather(*(store.add_execution("acme", _request(i), _result(i)) for i in ids))
        await asyncio.gather(
            *(store.update_execution("acme", i, _result(i, Status.RUNNING)) for i in ids)
        )
        listed = await store.list_executions("acme", status=Status.RUNNING)
        assert sorted(r.id for r in listed) == sorted(ids)
    finally:
        await store.aclose()


async def test_the_sqlite_file_and_its_directory_are_private(sqlite_database: str) -> None:
    store = await SqlStore.open(sqlite_database)
    try:
        await store.add_key(_key("k1", datetime.now(UTC)))
        path = Path(make_url(sqlite_database).database or "")
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        for file in (path, path.with_name(path.name + "-wal")):
            assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    finally:
        await store.aclose()


async def test_a_url_without_a_driver_gets_the_async_one(database: str) -> None:
    url = make_url(database)
    store = await SqlStore.open(url.set(drivername=url.get_backend_name()))
    try:
        assert await store.count_keys() == 0
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "not a URL",
        "mysql://ringfence:s3cret-pw@db.example/ringfence",
        "postgresql+asyncpg://ringfence:s3cret-pw@db.example/ringfence",
        "sqlite+pysqlite:///tmp/ringfence.db",
    ],
)
async def test_a_url_for_another_database_or_driver_is_refused(url: str) -> None:
    with pytest.raises(StoreError) as raised:
        await SqlStore.open(url)
    assert raised.value.code == "store_error"
    assert "s3cret-pw" not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("postgresql://ringfence:s3cret-pw@127.0.0.1:1/ringfence", "127.0.0.1:1"),
        ("postgresql://ringfence:s3cret-pw@/ringfence?host=/nonexistent", "/nonexistent"),
    ],
)
async def test_an_unreachable_database_is_a_store_error_that_hides_the_password(
    url: str, named: str
) -> None:
    with pytest.raises(StoreError) as raised:
        await SqlStore.open(url)
    assert raised.value.code == "store_error"
    assert named in str(raised.value) and "s3cret-pw" not in str(raised.value)


async def test_a_sqlite_file_that_cannot_be_created_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError) as raised:
        await SqlStore.open(f"sqlite:///{tmp_path}/file/data/ringfence.db")
    assert raised.value.code == "store_error"


def test_importing_the_store_package_leaves_sqlalchemy_out() -> None:
    code = (
        "import sys, ringfence, ringfence.store, ringfence.testing.store_checks; "
        "print(sorted(m for m in sys.modules if m.startswith(('sqlalchemy', 'alembic')))); "
        "from ringfence.store import SqlStore; print('sqlalchemy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]


async def test_two_stores_on_one_database_append_one_chain(database: str) -> None:
    """Two processes' appends (two engines here) interleave without breaking the chain."""
    from ringfence.audit.chain import AuditEvent
    from ringfence.audit.verify import verify_export
    from ringfence.models import AuditQuery

    one, two = await SqlStore.open(database), await SqlStore.open(database)
    try:

        async def append(store: SqlStore, name: str) -> None:
            for n in range(15):
                await store.append_audit([AuditEvent("acme", name, "test.append", f"n:{n}")] * 2)

        await asyncio.gather(append(one, "one"), append(two, "two"))
        records = await one.list_audit(AuditQuery(limit=1000))
    finally:
        await one.aclose()
        await two.aclose()
    assert [r.seq for r in records] == list(range(1, 61))
    verdict = verify_export([r.line() for r in records])
    assert verdict.problem is not None and "does not end with a seal" in verdict.problem.reason
    assert verdict.records == 60, "every link of the chain holds"
