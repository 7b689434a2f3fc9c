"""``ringfence audit tail``: the newest records from the store, filtered, and followed."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from pathlib import Path

from click.testing import CliRunner

from ringfence.cli import main
from tests._interrupt import interruptible
from tests.audit._log import RINGFENCE, append, events, ringfence


def tail(data_dir: Path, *options: str) -> tuple[int, list[str], str]:
    result = CliRunner().invoke(main, ["audit", "tail", "--data-dir", str(data_dir), *options])
    return result.exit_code, result.stdout.splitlines(), result.stderr


def test_tail_prints_the_newest_records_oldest_first(data_dir: Path) -> None:
    code, lines, _ = tail(data_dir, "-n", "3")
    assert code == 0
    assert [int(line.split()[0]) for line in lines] == [13, 14, 15]
    _seq, _day, time, tenant, actor, action, target, outcome = lines[-1].split()
    assert (tenant, actor, action, target, outcome) == (
        "acme", "key12", "sandbox.create", "sandbox:sb12", "ok",
    )  # fmt: skip
    assert time.endswith("Z")


def test_tail_shows_the_installations_own_records_with_a_dash(data_dir: Path) -> None:
    code, lines, _ = tail(data_dir, "--action", "audit.seal")
    assert code == 0 and [line.split()[3] for line in lines] == ["-", "-"]


def test_tail_as_json_prints_the_records_as_exported(data_dir: Path) -> None:
    code, lines, _ = tail(data_dir, "-n", "2", "--json")
    records = [json.loads(line) for line in lines]
    assert code == 0 and [r["seq"] for r in records] == [14, 15]
    assert records[1]["prev_hash"] == records[0]["hash"]


def test_tail_filters_by_tenant_and_action_prefix(data_dir: Path) -> None:
    code, lines, _ = tail(data_dir, "--tenant", "beta", "--action", "sandbox.", "-n", "100")
    assert code == 0 and [int(line.split()[0]) for line in lines] == [7, 8, 9, 10, 11]
    code, lines, _ = tail(data_dir, "--tenant", "nobody")
    assert code == 0 and lines == []


def test_tail_finds_old_matches_far_behind_the_head(tmp_path: Path) -> None:
    """The window before the head grows until it holds enough matching records."""
    directory = tmp_path / "data"
    append(directory, events("rare", 2))
    append(directory, events("busy", 700, start=2))
    code, lines, _ = tail(directory, "--tenant", "rare", "-n", "5")
    assert code == 0 and [int(line.split()[0]) for line in lines] == [1, 2]
    code, lines, _ = tail(directory, "-n", "1")
    assert [int(line.split()[0]) for line in lines] == [702]


def test_tail_of_an_empty_log_prints_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    append(directory, [])
    assert tail(directory) == (0, [], "")


def test_tail_without_a_database_is_exit_2(tmp_path: Path) -> None:
    code, lines, stderr = tail(tmp_path / "nowhere")
    assert code == 2 and lines == [] and "no Ringfence database" in stderr
    assert not (tmp_path / "nowhere").exists()


def test_tail_follow_prints_new_records_until_interrupted(data_dir: Path) -> None:
    process = subprocess.Popen(
        [str(RINGFENCE), "audit", "tail", "-n", "1", "--follow", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout or []])
    reader.start()
    try:
        assert lines.get(timeout=30).split()[0] == "15"
        append(data_dir, events("gamma", 1, start=50, action="key.create"))
        new = lines.get(timeout=30).split()
        assert (new[0], new[3], new[5]) == ("16", "gamma", "key.create")
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=30)
        reader.join(timeout=30)
    assert process.stderr is not None
    assert code == 0 and "Traceback" not in process.stderr.read()


def test_every_command_explains_itself() -> None:
    for command in ("export", "verify", "public-key", "tail"):
        run = ringfence("audit", command, "--help")
        assert run.code == 0 and len(run.stdout.split("\n\n")[1]) > 20, command
