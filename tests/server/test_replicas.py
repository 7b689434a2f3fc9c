"""Several control-plane replicas on one PostgreSQL never act twice.

Real ``ringfence serve`` processes on loopback ports share one real PostgreSQL database.
What can double-act, and what keeps it from doing so:
- the start-up sweeps (executions, sandboxes and proposals a dead process left running) would
  end a live replica's work: each row names the replica running it, and a replica is alive
  while it holds its PostgreSQL advisory lock (``store/_replica.py``);
- approval execution and proposal expiry: compare-and-set on the proposal's version;
- pool refills: each replica's pool is its own (its sandboxes live in its process).
"""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from ringfence.audit.signing import KEY_FILE
from ringfence.store import SqlStore
from ringfence.testing.store_checks import REPLICA_CHECKS, ReplicaCheck
from tests.server.test_serve_process import RINGFENCE, Server

RESTART = "the server stopped"  # how the restart errors begin (executions and sandboxes)
_LOCK_CLASS = 0x7266


@pytest.mark.parametrize("check", REPLICA_CHECKS, ids=lambda c: c.__name__)
async def test_replicas_stores_meet_the_contract(
    postgres_database: str, check: ReplicaCheck
) -> None:
    async def open_replica() -> SqlStore:
        return await SqlStore.open(postgres_database)

    await check(open_replica)


async def test_a_replica_takes_its_lease_back_after_losing_its_connection(
    postgres_database: str,
) -> None:
    """A database restart or a dropped connection releases a replica's lock; a replica
    starting then would end the live one's work as a dead replica's. It takes it back."""
    import asyncio

    store = await SqlStore.open(postgres_database, lease_check_seconds=0.1)
    holder = sa.text(
        "SELECT l.pid FROM pg_locks l JOIN pg_database d ON l.database = d.oid "
        "WHERE d.datname = current_database() AND l.locktype = 'advisory' "
        "AND l.classid = :c AND l.objid = :r AND l.objsubid = 2 AND l.granted"
    )
    engine = sa.create_engine(postgres_database, poolclass=sa.NullPool)  # psycopg, sync

    def lock_holder() -> int | None:
        with engine.connect() as connection:
            pid = connection.execute(holder, {"c": _LOCK_CLASS, "r": store.replica}).scalar()
            return int(pid) if pid is not None else None

    try:
        first = lock_holder()
        assert first is not None, "the replica holds its lock"
        with engine.connect() as connection:  # as a database restart would
            connection.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": first})
        for _ in range(200):
            again = lock_holder()
            if again is not None and again != first:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the replica did not take its id back")
    finally:
        await store.aclose()
        engine.dispose()
    assert lock_holder_after_close(postgres_database, store.replica) is None


def lock_holder_after_close(url: str, replica: int) -> int | None:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            return connection.execute(
                sa.text(
                    "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' "
                    "AND l.classid = :c AND l.objid = :r AND l.granted"
                ),
                {"c": _LOCK_CLASS, "r": replica},
            ).scalar()
    finally:
        engine.dispose()


class Replicas:
    """Servers on one database; each its own data directory, all with one seal key."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.root = root
        self.database_url = database_url
        self.servers: list[Server] = []

    def start(self, *names: str) -> list[Server]:
        """Start the servers at once (each answers /v1/health once its start-up sweeps ran);
        the very first alone: it makes the admin key and the seal key the others share."""
        if not self.servers and len(names) > 1:
            return self.start(names[0]) + self.start(*names[1:])
        servers = []
        for name in names:
            data = self.root / name
            if self.servers:
                data.mkdir(mode=0o700, parents=True)
                shutil.copy2(self.servers[0].data_dir / KEY_FILE, data / KEY_FILE)
            servers.append(Server(data, self.database_url))
        self.servers += servers
        with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(Server.start, servers))
        return servers

    def admin(self) -> dict[str, str]:
        key = (self.servers[0].data_dir / "admin-key").read_text().strip()
        return {"Authorization": f"Bearer {key}"}

    def approver(self) -> dict[str, str]:
        minted = subprocess.run(
            [RINGFENCE, "keys", "create", "--tenant", "default", "--role", "approver",
             "--data-dir", str(self.servers[0].data_dir), "--database-url", self.database_url],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return {"Authorization": f"Bearer {minted.stdout.strip()}"}

    def replica_locks(self) -> int:
        """How many replicas hold their lock on this database now."""
        engine = sa.create_engine(self.database_url, poolclass=sa.NullPool)  # psycopg, sync
        try:
            with engine.connect() as connection:
                return int(
                    connection.execute(
                        sa.text(
                            "SELECT count(*) FROM pg_locks l JOIN pg_database d "
                            "ON l.database = d.oid WHERE d.datname = current_database() "
                            "AND l.locktype = 'advisory' AND l.classid = :c AND l.granted"
                        ),
                        {"c": _LOCK_CLASS},
                    ).scalar_one()
                )
        finally:
            engine.dispose()


@pytest.fixture
def replicas(
    tmp_path: Path, postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Replicas]:
    monkeypatch.setenv("RINGFENCE_POOL_SIZES", '{"base": 0}')
    group = Replicas(tmp_path, postgres_database)
    yield group
    for server in group.servers:
        if server.process is not None and server.process.poll() is None:
            server.stop()


def _until(what: str, probe: Callable[[], Any], seconds: float = 60) -> Any:
    """Poll ``probe`` (bounded) until it returns something true; return that."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {seconds} s")


def _get(server: Server, path: str, headers: dict[str, str]) -> Any:
    response = httpx.get(f"{server.url}{path}", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _post(server: Server, path: str, headers: dict[str, str], body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", headers=headers, json=body, timeout=60)


def _audit(server: Server, headers: dict[str, str], action: str, target: str) -> list[Any]:
    records: list[Any] = _get(
        server, f"/v1/audit?action={action}&target={target}&limit=1000", headers
    )
    return records


def _propose(server: Server, headers: dict[str, str], command: list[str]) -> dict[str, Any]:
    body = {"request": {"command": command}, "rationale": "replica test"}
    response = _post(server, "/v1/proposals", headers, body)
    assert response.status_code in (200, 201), response.text
    proposal: dict[str, Any] = response.json()
    return proposal


def _approve(server: Server, headers: dict[str, str], proposal: dict[str, Any]) -> httpx.Response:
    body = {"digest": proposal["digest"], "reason": "ok"}
    return _post(server, f"/v1/proposals/{proposal['id']}/approve", headers, body)


def _running_work(
    server: Server, admin: dict[str, str], approver: dict[str, str]
) -> dict[str, str]:
    """A sandbox, an execution and an approved proposal, all running on ``server``."""
    sandbox = _post(server, "/v1/sandboxes", admin, {"timeout": 600})
    assert sandbox.status_code in (200, 201), sandbox.text
    execution = _post(
        server, "/v1/executions?wait=false", admin, {"id": "long", "command": ["sleep", "600"]}
    )
    assert execution.status_code == 202, execution.text
    proposal = _propose(server, admin, ["sleep", "600"])
    approved = _approve(server, approver, proposal)
    assert approved.status_code == 200 and approved.json()["state"] == "executing", approved.text
    work = {
        "sandbox": sandbox.json()["id"],
        "execution": "long",
        "proposal": proposal["id"],
        "remediation": approved.json()["execution_id"],
    }
    for execution_id in (work["execution"], work["remediation"]):
        _until(
            f"execution {execution_id} runs",
            lambda e=execution_id: (
                _get(server, f"/v1/executions/{e}", admin)["status"] == "running"
            ),
        )
    return work


def test_a_replica_starting_beside_a_live_one_ends_nothing_of_it(replicas: Replicas) -> None:
    (a,) = replicas.start("a")
    admin, approver = replicas.admin(), replicas.approver()
    work = _running_work(a, admin, approver)

    (b,) = replicas.start("b")  # its start-up sweeps have run once it answers

    for reader in (a, b):
        assert _get(reader, f"/v1/sandboxes/{work['sandbox']}", admin)["state"] == "running"
        assert _get(reader, "/v1/executions/long", admin)["status"] == "running"
        assert _get(reader, f"/v1/proposals/{work['proposal']}", admin)["state"] == "executing"
    # Only the replica that runs the sandbox can reach it; the other says so, killing nothing.
    for misdirected in (
        httpx.delete(f"{b.url}/v1/sandboxes/{work['sandbox']}", headers=admin, timeout=30),
        _post(b, f"/v1/sandboxes/{work['sandbox']}/timeout", admin, {"timeout": 60}),
    ):
        assert misdirected.status_code == 421, misdirected.text
        assert misdirected.json()["error"]["code"] == "sandbox_on_another_replica"
    assert _get(a, f"/v1/sandboxes/{work['sandbox']}", admin)["state"] == "running"
    # The replica that runs them ends them, as it would have without b.
    killed = httpx.delete(f"{a.url}/v1/sandboxes/{work['sandbox']}", headers=admin, timeout=30)
    assert killed.json()["state"] == "killed" and killed.json()["error"] is None
    for execution_id in (work["execution"], work["remediation"]):
        cancelled = _post(a, f"/v1/executions/{execution_id}/cancel", admin, None).json()
        assert cancelled["status"] == "cancelled"
        assert not (cancelled["error"] or "").startswith(RESTART)
    proposal = _until(
        "the proposal ends",
        lambda: (
            (p := _get(b, f"/v1/proposals/{work['proposal']}", admin))["state"] == "failed" and p
        ),
    )
    assert proposal["result"]["status"] == "cancelled", proposal["result"]
    executed = _until(
        "the proposal's end is audited",
        lambda: _audit(b, admin, "proposal.executed", f"proposal:{work['proposal']}"),
    )
    assert len(executed) == 1


def test_a_dead_replicas_work_is_ended_once_by_two_replicas_starting(replicas: Replicas) -> None:
    (a,) = replicas.start("a")
    admin, approver = replicas.admin(), replicas.approver()
    work = _running_work(a, admin, approver)
    a.kill()  # SIGKILL: no clean-up of its own; its sandboxes die with it
    _until("the dead replica's lock is released", lambda: replicas.replica_locks() == 0)

    b, c = replicas.start("b", "c")  # both sweep at once

    sandbox = _get(b, f"/v1/sandboxes/{work['sandbox']}", admin)
    assert sandbox["state"] == "failed" and sandbox["error"].startswith(RESTART)
    for execution_id in (work["execution"], work["remediation"]):
        execution = _get(c, f"/v1/executions/{execution_id}", admin)
        assert execution["status"] == "failed" and execution["error"].startswith(RESTART)
    proposal = _get(c, f"/v1/proposals/{work['proposal']}", admin)
    assert proposal["state"] == "failed"
    target = f"proposal:{work['proposal']}"
    _until("the proposal's end is audited", lambda: _audit(b, admin, "proposal.executed", target))
    assert len(_audit(c, admin, "proposal.executed", target)) == 1
    assert replicas.replica_locks() == 2


def test_an_approval_executes_once_when_approvers_race_on_two_replicas(
    replicas: Replicas,
) -> None:
    a, b = replicas.start("a", "b")
    admin = replicas.admin()
    first, second = replicas.approver(), replicas.approver()
    proposals = [_propose(a, admin, ["echo", f"fix {n}"]) for n in range(6)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for proposal in proposals:
            racing = [
                pool.submit(_approve, a, first, proposal),
                pool.submit(_approve, b, second, proposal),
            ]
            statuses = sorted(future.result().status_code for future in racing)
            assert statuses == [200, 409], statuses
    for proposal in proposals:
        target = f"proposal:{proposal['id']}"
        done = _until(
            "the proposal succeeds",
            lambda t=proposal["id"]: (
                (p := _get(b, f"/v1/proposals/{t}", admin))["state"] == "succeeded" and p
            ),
        )
        assert len(done["approvals"]) == 1
        executed = _until(
            "its run is audited", lambda t=target: _audit(a, admin, "proposal.executed", t)
        )
        assert len(executed) == 1
        submits = _audit(a, admin, "execution.submit", f"execution:{done['execution_id']}")
        assert len(submits) <= 1  # audited once if the service audits submits at all


def test_proposals_expire_once_with_two_replicas_sweeping(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RINGFENCE_APPROVAL_TTL", "1")
    a, b = replicas.start("a", "b")
    admin = replicas.admin()
    proposals = [_propose(a if n % 2 else b, admin, ["true"]) for n in range(4)]
    for proposal in proposals:
        _until(
            "the proposal expires",
            lambda p=proposal: _get(a, f"/v1/proposals/{p['id']}", admin)["state"] == "expired",
        )
    late = _approve(b, replicas.approver(), proposals[0])  # b finds it expired already
    assert late.status_code == 409
    for proposal in proposals:
        target = f"proposal:{proposal['id']}"
        expired = _until("its expiry is audited", lambda t=target: _audit(b, admin,
                         "proposal.expire", t))  # fmt: skip
        assert len(expired) == 1, expired


def _metrics(server: Server) -> dict[str, float]:
    text = httpx.get(f"{server.url}/v1/metrics", timeout=10).text
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def test_a_claim_refills_only_the_claiming_replicas_pool(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RINGFENCE_POOL_SIZES", '{"base": 1}')
    a, b = replicas.start("a", "b")
    admin = replicas.admin()
    ready = 'ringfence_pool_ready{template="base"}'
    hits = 'ringfence_pool_hits_total{template="base"}'
    for server in (a, b):
        _until("the pool fills", lambda s=server: _metrics(s)[ready] == 1)

    created = _post(a, "/v1/sandboxes", admin, {"timeout": 600})
    assert created.status_code in (200, 201), created.text

    _until("a's pool refills", lambda: _metrics(a)[ready] == 1)
    on_a, on_b = _metrics(a), _metrics(b)
    assert on_a[hits] == 1 and on_a["ringfence_sandboxes_running"] == 1
    assert on_b[hits] == 0 and on_b[ready] == 1 and on_b["ringfence_sandboxes_running"] == 0
    # The claimed sandbox is a's, seen as running by both (one record, one owner).
    assert _get(b, f"/v1/sandboxes/{created.json()['id']}", admin)["state"] == "running"


def test_a_sandbox_expires_once_on_the_replica_that_runs_it(replicas: Replicas) -> None:
    a, b = replicas.start("a", "b")
    admin = replicas.admin()
    created = _post(a, "/v1/sandboxes", admin, {"timeout": 2})
    assert created.status_code in (200, 201), created.text
    sandbox_id = created.json()["id"]
    ended = _until(
        "the sandbox expires",
        lambda: (s := _get(b, f"/v1/sandboxes/{sandbox_id}", admin))["state"] != "running" and s,
    )
    assert ended["state"] == "expired" and ended["error"] is None
    ends = _until(
        "its end is audited", lambda: _audit(b, admin, "sandbox.end", f"sandbox:{sandbox_id}")
    )
    assert [record["outcome"] for record in ends] == ["expired"]
