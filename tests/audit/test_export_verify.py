"""``ringfence audit export`` then ``verify``, as a user runs them: an untouched export passes,
and each way of tampering with one fails naming the line where the chain breaks."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from ringfence.audit.chain import GENESIS, SEAL_ACTION, canonical, record_hash
from ringfence.audit.signing import SealKey
from tests.audit._log import Run, append, events, ringfence

EXPORTED_LINES = 16
SEAL_LINES = (6, 12, 16)


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(canonical(record).decode() + "\n" for record in records))
    return path


def verify(path: Path, *options: str) -> Run:
    return ringfence("audit", "verify", "--json", *options, path)


def assert_fails_at(run: Run, line: int, reason: str) -> None:
    """Exit 1; the verdict names ``line``; the one-line message on stderr names it too."""
    assert run.code == 1, run.stderr
    problem = run.json()["problem"]
    assert problem["line"] == line, problem
    assert reason in problem["reason"], problem
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert f"line {line}" in run.stderr or f"last line ({line - 1})" in run.stderr, run.stderr


def rehash(records: list[dict[str, Any]], start: int = 0) -> None:
    """Renumber and re-chain ``records`` from index ``start``, as a forger with no key would."""
    for index in range(start, len(records)):
        record = records[index]
        record["seq"] = index + 1
        record["prev_hash"] = records[index - 1]["hash"] if index else GENESIS
        record["hash"] = record_hash(record)


# --- an untouched export ----------------------------------------------------------------------


def test_an_export_ends_with_a_fresh_seal_and_verifies(exported: Path) -> None:
    records = read(exported)
    assert [r["seq"] for r in records] == list(range(1, EXPORTED_LINES + 1))
    assert [n for n, r in enumerate(records, 1) if r["action"] == SEAL_ACTION] == list(SEAL_LINES)
    run = verify(exported)
    assert run.code == 0, run.stderr
    verdict = run.json()
    assert verdict["ok"] and verdict["records"] == EXPORTED_LINES and verdict["seals"] == 3
    assert verdict["last_seal_seq"] == EXPORTED_LINES and not verdict["pinned"]


def test_the_human_verdict_says_when_the_key_came_from_the_file(
    exported: Path, pinned_key: str
) -> None:
    unpinned = ringfence("audit", "verify", exported)
    assert unpinned.code == 0 and unpinned.stdout.startswith("OK: 16 records, 3 seals")
    assert "TAKEN FROM THE FILE" in unpinned.stdout and "--public-key" in unpinned.stdout
    pinned = ringfence("audit", "verify", "--public-key", pinned_key, exported)
    assert pinned.code == 0 and f"pinned key {pinned_key}" in pinned.stdout
    assert "FROM THE FILE" not in pinned.stdout


def test_an_export_verifies_against_the_pinned_key(exported: Path, pinned_key: str) -> None:
    run = verify(exported, "--public-key", pinned_key)
    assert run.code == 0, run.stderr
    assert run.json()["pinned"] and run.json()["public_key"] == pinned_key


def test_a_wrong_pinned_key_fails_at_the_first_seal(exported: Path) -> None:
    run = verify(exported, "--public-key", SealKey.generate().public_key)
    assert_fails_at(run, SEAL_LINES[0], "signature does not verify")


def test_each_export_seals_anew_and_holds_the_earlier_ones(data_dir: Path, tmp_path: Path) -> None:
    first, again = tmp_path / "first.jsonl", tmp_path / "again.jsonl"
    run = ringfence("audit", "export", "--out", first, "--data-dir", data_dir)
    assert run.code == 0 and run.stdout == ""
    assert "16 records (3 seals)" in run.stderr
    assert SealKey.load_or_create(data_dir).public_key in run.stderr
    assert stat.S_IMODE(first.stat().st_mode) == 0o600, "records name commands and paths"
    append(data_dir, events("acme", 2, start=20))
    assert ringfence("audit", "export", "--out", again, "--data-dir", data_dir).code == 0
    assert read(again)[:EXPORTED_LINES] == read(first)
    assert len(read(again)) == EXPORTED_LINES + 3
    assert verify(again, "--min-seq", str(EXPORTED_LINES + 3)).code == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temp left"


def test_an_export_to_stdout_verifies_from_stdin(data_dir: Path) -> None:
    exported = ringfence("audit", "export", "--out", "-", "--data-dir", data_dir)
    assert exported.code == 0 and exported.stdout.count("\n") == EXPORTED_LINES
    run = ringfence("audit", "verify", "--json", "-", stdin=exported.stdout)
    assert run.code == 0 and run.json()["records"] == EXPORTED_LINES


def test_export_refuses_a_seal_key_that_did_not_seal_the_log(
    data_dir: Path, tmp_path: Path
) -> None:
    (data_dir / "audit-seal-key").unlink()
    run = ringfence("audit", "export", "--out", tmp_path / "x", "--data-dir", data_dir)
    assert run.code == 1 and "--data-dir" in run.stderr and "Traceback" not in run.stderr
    SealKey.load_or_create(data_dir)  # another key
    run = ringfence("audit", "export", "--out", tmp_path / "x", "--data-dir", data_dir)
    assert run.code == 1 and "not the one that sealed" in run.stderr
    assert not (tmp_path / "x").exists()


def test_export_needs_a_database(tmp_path: Path) -> None:
    run = ringfence("audit", "export", "--out", tmp_path / "x", "--data-dir", tmp_path / "no")
    assert run.code == 2 and "no Ringfence database" in run.stderr
    assert not (tmp_path / "no").exists(), "a mistyped --data-dir is not created"


def test_export_to_an_unwritable_place_is_a_message(data_dir: Path, tmp_path: Path) -> None:
    run = ringfence("audit", "export", "--out", tmp_path / "no" / "x", "--data-dir", data_dir)
    assert run.code == 2 and run.stderr.startswith("ringfence: cannot write")
    assert "Traceback" not in run.stderr


def test_public_key_is_the_data_directorys_and_is_made_when_missing(tmp_path: Path) -> None:
    first = ringfence("audit", "public-key", "--data-dir", tmp_path / "fresh")
    assert first.code == 0
    assert first.stdout.strip() == SealKey.load_or_create(tmp_path / "fresh").public_key
    assert ringfence("audit", "public-key", "--data-dir", tmp_path / "fresh").stdout == first.stdout


# --- tampering --------------------------------------------------------------------------------


def test_a_changed_record_fails_at_its_line(exported: Path) -> None:
    records = read(exported)
    records[2]["outcome"] = "denied"  # line 3, its hash left as it was
    assert_fails_at(verify(write(exported, records)), 3, "does not match its hash")


def test_a_changed_record_with_its_hash_recomputed_fails_at_the_next_line(exported: Path) -> None:
    records = read(exported)
    records[2]["actor"] = "someone-else"
    records[2]["hash"] = record_hash(records[2])
    assert_fails_at(verify(write(exported, records)), 4, "prev_hash differs")


def test_a_deleted_record_fails_where_it_was(exported: Path) -> None:
    records = read(exported)
    del records[2]
    assert_fails_at(verify(write(exported, records)), 3, "sequence 4 where 3 was due")


def test_a_deleted_record_fails_even_with_the_rest_rechained(exported: Path) -> None:
    records = read(exported)
    del records[2]
    rehash(records, start=2)
    assert_fails_at(verify(write(exported, records)), 5, "signature does not verify")


def test_an_inserted_copy_fails_where_it_was_put(exported: Path) -> None:
    records = read(exported)
    records.insert(4, dict(records[1]))  # a copy of line 2 as line 5
    assert_fails_at(verify(write(exported, records)), 5, "sequence 2 where 5 was due")


def test_an_inserted_forgery_with_recomputed_hashes_fails_at_the_next_seal(exported: Path) -> None:
    records = read(exported)
    forged = dict(records[7], actor="mallory", action="key.create", target="key:evil")
    records.insert(7, forged)  # line 8; the original seal at line 12 is now line 13
    rehash(records, start=7)
    assert_fails_at(verify(write(exported, records)), 13, "signature does not verify")


def test_a_forgery_appended_after_the_last_seal_fails_as_unsealed(exported: Path) -> None:
    records = read(exported)
    records.append(dict(records[0], tenant="acme", action="key.create"))
    rehash(records, start=EXPORTED_LINES)
    run = verify(write(exported, records))
    assert_fails_at(run, EXPORTED_LINES + 2, "does not end with a seal")


def test_swapped_records_fail_at_the_first_of_them(exported: Path) -> None:
    records = read(exported)
    records[2], records[3] = records[3], records[2]
    assert_fails_at(verify(write(exported, records)), 3, "sequence 4 where 3 was due")


def test_a_cut_off_end_fails_as_unsealed(exported: Path) -> None:
    records = read(exported)[:-2]  # the export's own seal and the record before it
    run = verify(write(exported, records))
    assert_fails_at(run, EXPORTED_LINES - 1, "does not end with a seal")
    assert "after the last line (14)" in run.stderr and "sequence 13 on" in run.stderr


def test_an_end_cut_at_an_older_seal_passes_unless_the_length_is_pinned(
    exported: Path, pinned_key: str
) -> None:
    """What verify cannot see: lines 13-16 gone leaves a whole chain ending with a genuine
    seal (seq 12). Only something known from outside the file (how far the log reached)
    catches it; ``--min-seq`` takes that, and the OK line shows the last seal's seq and time
    for a reader to compare."""
    cut = write(exported, read(exported)[: SEAL_LINES[1]])
    run = verify(cut, "--public-key", pinned_key)
    assert run.code == 0 and run.json()["last_seal_seq"] == SEAL_LINES[1]
    assert "ends with seal 12 at" in ringfence("audit", "verify", cut).stdout
    run = verify(cut, "--public-key", pinned_key, "--min-seq", str(EXPORTED_LINES))
    assert_fails_at(run, SEAL_LINES[1] + 1, "cut off its end")
    assert verify(cut, "--min-seq", str(SEAL_LINES[1])).code == 0


def test_a_chain_rewritten_with_another_key_passes_only_unpinned(
    exported: Path, pinned_key: str
) -> None:
    records = read(exported)
    records[2]["outcome"] = "denied"
    forger = SealKey.generate()
    for index, record in enumerate(records):
        record["prev_hash"] = records[index - 1]["hash"] if index else GENESIS
        if record["action"] == SEAL_ACTION:
            record["details"] = forger.sign(record["seq"], record["at"], record["prev_hash"])
        record["hash"] = record_hash(record)
    forged = write(exported, records)
    unpinned = verify(forged)
    assert unpinned.code == 0 and unpinned.json()["public_key"] == forger.public_key
    assert_fails_at(verify(forged, "--public-key", pinned_key), 6, "signature does not verify")


@pytest.mark.parametrize(
    ("field", "value"),
    [("actor", "mallory"), ("outcome", "denied"), ("tenant", "acme"), ("target", "x")],
)
def test_the_last_seals_own_fields_cannot_be_changed(
    exported: Path, field: str, value: str
) -> None:
    records = read(exported)
    records[-1][field] = value
    records[-1]["hash"] = record_hash(records[-1])
    assert_fails_at(verify(write(exported, records)), EXPORTED_LINES, "altered")


def test_nothing_can_be_added_to_a_seal(exported: Path) -> None:
    records = read(exported)
    records[-1]["details"]["note"] = "added later"
    records[-1]["hash"] = record_hash(records[-1])
    assert_fails_at(verify(write(exported, records)), EXPORTED_LINES, "altered")


def test_a_seal_carrying_a_malformed_key_fails_at_its_line(exported: Path) -> None:
    records = read(exported)
    records[5]["details"]["public_key"] = "not base64!"
    records[5]["hash"] = record_hash(records[5])
    rehash(records, start=6)
    assert_fails_at(verify(write(exported, records)), 6, "signature does not verify")


def test_a_number_json_cannot_hash_fails_at_its_line(exported: Path) -> None:
    lines = exported.read_text().splitlines()
    lines[3] = lines[3].replace('"details":{"n":3}', '"details":{"n":NaN}')
    exported.write_text("\n".join(lines) + "\n")
    assert_fails_at(verify(exported), 4, "not an audit record")


def test_bytes_that_are_not_utf8_fail_that_record(exported: Path) -> None:
    data = exported.read_bytes().split(b"\n")
    data[6] = data[6].replace(b"beta", b"b\xffta")
    exported.write_bytes(b"\n".join(data))
    assert_fails_at(verify(exported), 7, "does not match its hash")


# --- inputs verify cannot use -----------------------------------------------------------------


def test_a_missing_file_is_exit_2(tmp_path: Path) -> None:
    run = ringfence("audit", "verify", tmp_path / "missing.jsonl")
    assert run.code == 2 and "cannot read" in run.stderr and "Traceback" not in run.stderr


def test_a_directory_is_exit_2(tmp_path: Path) -> None:
    run = ringfence("audit", "verify", tmp_path)
    assert run.code == 2 and "Traceback" not in run.stderr


def test_a_file_that_is_not_json_is_exit_2(tmp_path: Path) -> None:
    not_json = tmp_path / "notes.txt"
    not_json.write_text("these are not audit records\n")
    run = ringfence("audit", "verify", "--json", not_json)
    assert run.code == 2 and "not an audit export" in run.stderr and run.stdout == ""


def test_an_empty_file_is_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    run = ringfence("audit", "verify", empty)
    assert run.code == 2 and "holds no records" in run.stderr


def test_a_malformed_pinned_key_is_exit_2(exported: Path) -> None:
    for key in ("not-base64!", "AAAA"):
        run = ringfence("audit", "verify", "--public-key", key, exported)
        assert run.code == 2 and run.stderr.startswith("ringfence: --public-key:"), run.stderr
