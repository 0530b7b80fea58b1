"""The audit over entry logs that garbage collection and compaction changed (bookie/compaction.py): entries moved
to a new log still count, an old log compacted away is simply absent, a finished compaction's new log not yet
renamed (`N-from-O.compacted`, its old log already deleted) is read as log N, an unfinished one
(`N-from-O.compacting`, never referenced) is not read, and copies of a deleted ledger are benign.

Each bookie here lost its first journal (evidence from journals alone would be partial), so the entry logs are
what makes its evidence complete: an entry log the audit failed to read would show as missing copies.
"""
from __future__ import annotations

import os

import pytest

from audit.conftest import audit
from audit.synth import Synth
from bksim.formats import entry_log as log_fmt
from bksim.formats import journal as jfmt

B1, B2, B3, B4 = Synth.bookies
ENTRIES = 9


@pytest.fixture
def synth(tmp_path):
    return Synth(str(tmp_path / "cluster"))


def _without_first_journal(synth: Synth, ledger_ids: set[int]) -> dict[str, list[bytes]]:
    """Each bookie holding entries of `ledger_ids`: its journal 1 becomes id 2 without those records; returns
    their entries per bookie (what the bookie's entry logs must hold)."""
    moved = {}
    for bookie in synth.bookies:
        kept, entries = [], []
        for record in synth.journals[bookie][1]:
            entry = record[jfmt.RECORD_PREFIX_BYTES:]
            if int.from_bytes(entry[:8], "big", signed=True) in ledger_ids:
                entries.append(entry)
            else:
                kept.append(record)
        if entries:
            synth.journals[bookie] = {2: kept}
            moved[bookie] = entries
    return moved


def _of(ledger_id: int, entries: list[bytes]) -> list[bytes]:
    return [e for e in entries if int.from_bytes(e[:8], "big", signed=True) == ledger_id]


def _write_log(synth: Synth, bookie: str, name: str, entries: list[bytes]) -> str:
    log_dir = os.path.join(synth.root, synth.name(bookie), "ledgers", "entrylogs")
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, name)
    with open(path, "wb") as f:
        f.write(log_fmt.encode_header() + b"".join(log_fmt.encode_record(e) for e in entries))
    return path


def _run(synth: Synth, tmp_path, out: str):
    return audit([synth.root], synth.snapshot_path, tmp_path / out,
                 entrylogs=[os.path.join(synth.root, synth.name(b), "ledgers") for b in synth.bookies])


def test_entries_moved_by_compaction_count_and_the_compacted_away_log_is_not_missed(synth, tmp_path):
    synth.ledger(1, 3, 2, 2, ENTRIES)
    synth.ledger(2, 3, 2, 2, ENTRIES)  # deleted below: its copies are benign
    moved = _without_first_journal(synth, {1})
    deleted_copies = sum(len(synth.metadata[2].write_set(e)) for e in range(ENTRIES))
    del synth.metadata[2]
    synth.save()
    for bookie, entries in moved.items():  # log 1 was compacted into log 5 (a `.log` again) and deleted
        _write_log(synth, bookie, log_fmt.entry_log_file_name(5), entries[:2])
        _write_log(synth, bookie, log_fmt.entry_log_file_name(6), entries[2:])
    report, status = _run(synth, tmp_path, "out")
    assert (status, report["violations"], report["reported"]) == (0, [], [])
    assert report["totals"]["entrylog_entries"] == ENTRIES * 2 and report["replica_histogram"] == {"2": ENTRIES}
    assert {b["evidence"] for b in report["inputs"]["bookies"]} == {"complete"}
    assert report["benign_counts"]["unknown_ledger_copies"] == deleted_copies


def test_a_finished_compactions_new_log_not_yet_renamed_is_read_and_an_unfinished_one_is_not(synth, tmp_path):
    synth.ledger(1, 3, 2, 2, ENTRIES)
    synth.ledger(2, 3, 2, 2, ENTRIES)
    moved = _without_first_journal(synth, {1, 2})
    synth.save()
    for bookie, entries in moved.items():  # killed between deleting old log 1 and renaming 5-from-1.compacted
        _write_log(synth, bookie, log_fmt.compaction_file_name(5, 1, log_fmt.COMPACTED), _of(1, entries))
        _write_log(synth, bookie, log_fmt.entry_log_file_name(6), _of(2, entries))
    report, status = _run(synth, tmp_path, "out")
    assert (status, report["violations"], report["reported"]) == (0, [], [])
    assert report["totals"]["entrylog_entries"] == ENTRIES * 2 * 2

    # the same files with an unfinished compaction instead (its old log gone only for the test's sake): the
    # file is never referenced and not read, so ledger 1's copies are missing
    for bookie in moved:
        log_dir = os.path.join(synth.root, synth.name(bookie), "ledgers", "entrylogs")
        os.rename(os.path.join(log_dir, log_fmt.compaction_file_name(5, 1, log_fmt.COMPACTED)),
                  os.path.join(log_dir, log_fmt.compaction_file_name(5, 1, log_fmt.COMPACTING)))
    report, status = _run(synth, tmp_path, "out2")
    assert status == 1 and report["totals"]["entrylog_entries"] == ENTRIES * 2
    assert {(v["ledger"], v["rule"]) for v in report["violations"]} == {(1, "gap")}
