"""The chaos disk faults on synthetic bookie files (chaos/disk.py), and the audit judgement after a journal was
truncated into synced records (check.judge_truncation). No processes: files in tmp_path and dicts."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from bksim.chaos import check, disk
from bksim.formats import entry_log
from bksim.formats import journal as jfmt
from bksim.formats.entry import decode_entry, encode_entry
from bksim.model.errors import FormatError

INSTANCE = "00000000-0000-0000-0000-000000000001"
GROUP = 3


def write_journal(tmp_path, entries: list[tuple[int, int]]) -> str:
    """The entries' records in group writes of GROUP records each."""
    jdir = tmp_path / "journal"
    jdir.mkdir()
    records = [jfmt.entry_record(encode_entry(lid, eid, eid - 1, 0, b"p" * 40), 0) for lid, eid in entries]
    data = jfmt.encode_file(INSTANCE, [records[i:i + GROUP] for i in range(0, len(records), GROUP)])
    (jdir / jfmt.journal_file_name(1)).write_bytes(data)
    return str(jdir)


def records_of(jdir: str):
    data = open(os.path.join(jdir, jfmt.journal_file_name(1)), "rb").read()
    return jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, newest=True)


def test_tear_appends_a_torn_copy_that_replay_would_cut_and_keeps_every_record(tmp_path):
    jdir = write_journal(tmp_path, [(1, e) for e in range(5)])
    what = disk.tear_journal(jdir, random.Random(1))
    assert what.startswith("tore ")
    scan = records_of(jdir)
    assert len(scan.records) == 5 and scan.torn is not None


@pytest.mark.parametrize("seed", range(8))
def test_truncate_cuts_inside_one_of_the_last_records_and_names_the_copies_it_removed(tmp_path, seed):
    jdir = write_journal(tmp_path, [(7, e) for e in range(10)])
    what, removed = disk.truncate_journal(jdir, random.Random(seed))
    scan = records_of(jdir)
    kept = {jfmt_ids(r) for r in scan.records}
    assert what.startswith("truncated ") and scan.torn is not None  # never at a record boundary
    assert kept | removed == {(7, e) for e in range(10)} and not kept & removed
    # replay keeps whole groups only: the cut group goes, with the records before the cut in it
    assert len(kept) % GROUP == 0 and 1 <= len(removed) <= disk.TRUNCATE_RECORDS_MAX + GROUP - 1


def jfmt_ids(record) -> tuple[int, int]:
    return disk.ENTRY_IDS.unpack_from(record.body)


def test_flip_damages_one_payload_byte_of_a_picked_entry(tmp_path):
    log_dir = tmp_path / "ledgers" / "entrylogs"
    log_dir.mkdir(parents=True)
    entries = [encode_entry(3, e, e - 1, 0, b"q" * 50) for e in range(6)]
    data = entry_log.encode_header() + b"".join(entry_log.encode_record(e) for e in entries)
    (log_dir / entry_log.entry_log_file_name(1)).write_bytes(data)
    what, flip = disk.flip_entry_log_byte(str(tmp_path / "ledgers"), random.Random(2), lambda lid, eid: eid == 4)
    assert flip is not None and (flip.ledger_id, flip.entry_id) == (3, 4), what
    assert flip.original == entries[4] and flip.corrupted != flip.original
    with pytest.raises(FormatError):
        decode_entry(flip.corrupted, ledger_id=3, entry_id=4)
    _, records, _ = entry_log.scan((log_dir / entry_log.entry_log_file_name(1)).read_bytes())
    stored = {r.entry_id: r.entry for r in records}
    assert stored[4] == flip.corrupted and all(stored[e] == entries[e] for e in range(6) if e != 4)
    none, nothing = disk.flip_entry_log_byte(str(tmp_path / "ledgers"), random.Random(2), lambda lid, eid: False)
    assert nothing is None and none.startswith("no stored entry")


FILL_SCRIPT = """
import json, os, sys
from bksim.chaos import disk
path = sys.argv[1]
def used():
    st = os.statvfs(path)
    return 1 - st.f_bavail / st.f_blocks
out = {"before": used(), "fill": disk.fill_disk(path, 0.9)}
out["full"] = used()
out["again"] = disk.fill_disk(path, 0.9)
out["drain"] = disk.drain_disk(path)
out["after"] = used()
print(json.dumps(out))
"""


def test_fill_and_drain_a_real_small_disk(tmp_path):
    # an 8 MiB tmpfs in a private mount namespace (as the disk-full scenario's bookie has): it dies with the
    # child, nothing on this machine's disks or mount table changes
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs -o size=8m bksim-test "$0" && exec "$@"', str(mount), sys.executable, "-c", FILL_SCRIPT,
         str(mount)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["before"] < 0.1 and out["full"] >= 0.9 and out["after"] < 0.1, out
    assert out["fill"].startswith("balloon of ") and "already" in out["again"], out
    assert out["drain"].startswith("removed the 7 MiB balloon"), out
    assert not any(mount.iterdir())  # the tmpfs went with the child; the directory underneath was never written


def finding(rule: str, ledger: int, first: int, last: int, missing: list[str], **extra) -> dict:
    return dict(rule=rule, ledger=ledger, first_entry=first, last_entry=last, missing=missing, **extra)


def test_truncation_judgement_accepts_exactly_the_removed_copies():
    lost = {"b1": {(5, 10), (5, 11)}}
    ok = {"violations": [finding("below_ack_quorum", 5, 10, 11, ["b1"])],
          "reported": [finding("under_replicated", 6, 0, 3, ["b2"])],  # a kill -9's under-replication: fine
          "rule_counts": {"below_ack_quorum": {"class": "violation", "findings": 1}}}
    problems, figures = check.judge_truncation(ok, lost)
    assert problems == [] and figures["reported_missing"] == 2 and figures["removed_copies"] == 2


@pytest.mark.parametrize("bad", [
    finding("below_ack_quorum", 5, 10, 12, ["b1"]),  # entry 12 was not cut
    finding("below_ack_quorum", 5, 10, 11, ["b2"]),  # another bookie
    finding("divergence", 5, 10, 10, []),
    dict(rule="torn_tail_below_checkpoint", bookie="b2"),
])
def test_truncation_judgement_rejects_anything_else(bad):
    report = {"violations": [bad], "reported": [], "rule_counts": {bad["rule"]: {"class": "violation", "findings": 1}}}
    problems, _ = check.judge_truncation(report, {"b1": {(5, 10), (5, 11)}})
    assert len(problems) == 1


def test_truncation_judgement_refuses_a_truncated_listing():
    report = {"violations": [], "reported": [], "rule_counts": {"gap": {"class": "violation", "findings": 3}}}
    problems, _ = check.judge_truncation(report, {"b1": set()})
    assert problems and "cannot be judged" in problems[0]
