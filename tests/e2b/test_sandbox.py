"""E2B's ``Sandbox`` lifecycle through the unmodified SDK: create, connect, list, info,
timeouts, kill, and the ``with`` form."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from e2b import (
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)
from tests.e2b.conftest import E2bServer, audit_records


def test_with_create_runs_and_kills_on_exit(e2b_server: E2bServer) -> None:
    with Sandbox.create(timeout=120) as sbx:
        assert sbx.is_running()
        assert sbx.commands.run("echo hi").stdout == "hi\n"
        info = sbx.get_info()
        assert info.template_id == "base" and info.state is SandboxState.RUNNING
        assert timedelta(seconds=100) < info.end_at - info.started_at <= timedelta(seconds=121)
    assert not sbx.is_running()
    with pytest.raises(SandboxNotFoundException):
        sbx.get_info()


def test_create_takes_metadata_envs_and_timeout(e2b_server: E2bServer) -> None:
    tag = uuid.uuid4().hex
    sbx = Sandbox.create(
        metadata={"tag": tag, "k": "v w&x=1"}, envs={"GREETING": "hej"}, timeout=77
    )
    try:
        info = sbx.get_info()
        assert info.metadata == {"tag": tag, "k": "v w&x=1"}
        assert info.end_at - info.started_at == timedelta(seconds=77)
        assert sbx.commands.run("echo $GREETING").stdout == "hej\n"
        assert "GREETING" not in str(info), "environment values are never shown"
    finally:
        assert sbx.kill() is True
    assert sbx.kill() is False, "a second kill finds nothing"
    assert Sandbox.kill(sbx.sandbox_id) is False


def test_connect_reaches_the_same_sandbox_and_only_extends_its_timeout(
    e2b_server: E2bServer,
) -> None:
    with Sandbox.create(timeout=300) as sbx:
        sbx.files.write("/home/user/mark", "here")
        again = Sandbox.connect(sbx.sandbox_id, timeout=10)
        assert again.files.read("/home/user/mark") == "here"
        assert again.get_info().end_at == sbx.get_info().end_at, "10 s is shorter: unchanged"
        longer = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert longer.get_info().end_at - datetime.now(UTC) > timedelta(seconds=500)
        assert sbx.connect().commands.run("cat mark").stdout == "here"


def test_set_timeout_moves_the_end_and_a_short_one_kills(e2b_server: E2bServer) -> None:
    sbx = Sandbox.create(timeout=300)
    sbx.set_timeout(900)
    assert sbx.get_info().end_at - datetime.now(UTC) > timedelta(seconds=800)
    sbx.set_timeout(1)
    # Until the server has recorded the end (is_running only probes the daemon, which a
    # loaded machine can fail to answer before the end is recorded), bounded.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            sbx.get_info()
        except SandboxNotFoundException:
            break
        time.sleep(0.05)
    assert not sbx.is_running()
    with pytest.raises(SandboxNotFoundException):
        sbx.set_timeout(60)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id)


def test_list_filters_by_metadata_and_pages(e2b_server: E2bServer) -> None:
    tag = uuid.uuid4().hex
    boxes = [Sandbox.create(metadata={"tag": tag, "n": str(i), "odd k/y": "a b"}) for i in range(3)]
    other = Sandbox.create(metadata={"tag": "someone else"})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
        assert {s.sandbox_id for s in found} == {b.sandbox_id for b in boxes}
        assert all(s.state is SandboxState.RUNNING and s.metadata["tag"] == tag for s in found)
        one = Sandbox.list(query=SandboxQuery(metadata={"tag": tag, "n": "1"})).next_items()
        assert [s.sandbox_id for s in one] == [boxes[1].sandbox_id]
        encoded = Sandbox.list(query=SandboxQuery(metadata={"odd k/y": "a b"})).next_items()
        assert {s.sandbox_id for s in encoded} >= {b.sandbox_id for b in boxes}
        paused = SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED])
        assert Sandbox.list(query=paused).next_items() == []

        pages = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2)
        seen = pages.next_items()
        assert len(seen) == 2 and pages.has_next
        seen += pages.next_items()
        assert not pages.has_next
        assert sorted(s.sandbox_id for s in seen) == sorted(b.sandbox_id for b in boxes)

        boxes[0].kill()
        left = Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
        assert boxes[0].sandbox_id not in {s.sandbox_id for s in left}, "ended ones are gone"
    finally:
        for sbx in [*boxes, other]:
            sbx.kill()


def test_list_started_after_includes_its_boundary(e2b_server: E2bServer) -> None:
    """E2B's ``started_after`` is "started at or after": the sandbox started at that very
    instant is listed."""
    tag = uuid.uuid4().hex
    with Sandbox.create(metadata={"tag": tag}) as sbx:
        started = sbx.get_info().started_at
        at = SandboxQuery(metadata={"tag": tag}, started_after=started)
        assert [s.sandbox_id for s in Sandbox.list(query=at).next_items()] == [sbx.sandbox_id]
        later = SandboxQuery(metadata={"tag": tag}, started_after=started + timedelta(0, 0, 1))
        assert Sandbox.list(query=later).next_items() == []


def test_code_interpreter_template_name_maps_to_a_ringfence_template(e2b_server: E2bServer) -> None:
    with Sandbox.create("code-interpreter-v1") as sbx:
        # Not built here, so the host's system directories: python3 with pandas.
        assert sbx.get_info().template_id == "base"
        assert sbx.commands.run("python3 -c 'import pandas'").exit_code == 0


def test_unknown_templates_and_bad_timeouts_are_refused_by_name(e2b_server: E2bServer) -> None:
    with pytest.raises(SandboxException, match="no-such-template"):
        Sandbox.create("no-such-template")
    with pytest.raises(SandboxException, match="timeout"):
        Sandbox.create(timeout=10**9)


def test_what_ringfence_cannot_honour_is_refused_not_dropped(e2b_server: E2bServer) -> None:
    with pytest.raises(SandboxException, match="allow_internet_access"):
        Sandbox.create(allow_internet_access=True)
    # A timeout pause keeps the files only here: asking it to keep memory is refused.
    with pytest.raises(SandboxException, match="autoPauseMemory"):
        Sandbox.create(lifecycle={"on_timeout": {"action": "pause", "mode": "full"}})
    with Sandbox.create(allow_internet_access=False) as sbx:
        assert sbx.commands.run("true").exit_code == 0


def test_lifecycle_is_on_the_audit_record_under_the_callers_key(e2b_server: E2bServer) -> None:
    key_id = e2b_server.key.split("_")[1]
    with Sandbox.create() as sbx:
        sbx.set_timeout(100)
    target = f"sandbox:{sbx.sandbox_id}"
    for action in ("sandbox.create", "sandbox.set_timeout", "sandbox.kill"):
        records = audit_records(e2b_server, target, action)
        assert [r["actor"] for r in records] == [key_id], action
