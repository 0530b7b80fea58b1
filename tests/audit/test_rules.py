"""The audit's rules on synthetic bookie files (audit/synth.py writes them with the project's format code):
every rule fires on what it names and stays quiet on the benign look-alikes (PROTOCOL.md §7). --local driver.
"""
from __future__ import annotations

import os

import pytest

from audit.conftest import audit
from audit.synth import Synth, flip, patch, record_offsets, truncate
from bksim.audit.snapshot import AuditInputError
from bksim.formats import entry_log as log_fmt
from bksim.formats import journal as jfmt
from bksim.formats.entry import encode_entry

B1, B2, B3, B4 = Synth.bookies


def findings(report: dict, kind: str) -> list[tuple]:
    return [(f["rule"], f.get("ledger"), f.get("first_entry"), f.get("last_entry")) for f in report[kind]]


def run(synth: Synth, tmp_path, **kw):
    synth.save()
    return audit([synth.root], synth.snapshot_path, tmp_path / "out", **kw)


@pytest.fixture
def synth(tmp_path):
    return Synth(str(tmp_path / "cluster"))


def test_a_clean_cluster_reports_nothing(synth, tmp_path):
    synth.ledger(1, 3, 2, 2, 20)
    synth.ledger(2, 3, 3, 2, 20)
    synth.ledger(3, 3, 3, 2, 10, close=False)  # OPEN: confirmed end = highest LAC carried (entry 9 carries 8)
    report, status = run(synth, tmp_path)
    assert (status, report["verdict"], report["exit_status"]) == (0, "clean", 0)
    assert report["violations"] == report["reported"] == report["benign"] == []
    assert report["rule_counts"] == {}
    assert report["replica_histogram"] == {"2": 20, "3": 29}
    assert report["benign_counts"] == {"open_ledger_tail": 3}  # entry 9 of ledger 3 on its three bookies
    ledger3 = next(lg for lg in report["ledgers"] if lg["ledger"] == 3)
    assert (ledger3["state"], ledger3["confirmed_end"], ledger3["entries"], ledger3["copies"]) == ("OPEN", 8, 10, 30)
    assert report["totals"]["records"] == 20 * 2 + 20 * 3 + 10 * 3
    assert os.path.exists(tmp_path / "out" / "report.html") and os.path.exists(tmp_path / "out" / "report.json")


def test_missing_copies_are_gaps_below_qa_or_under_replicated(synth, tmp_path):
    everywhere = set(synth.bookies)
    md = synth.ledger(1, 3, 2, 2, 20, skip={5: {B3}, 10: everywhere, 11: everywhere, 12: everywhere})
    assert md.write_set(5) == [B3, B1]
    synth.ledger(2, 3, 3, 2, 20, skip={4: {B1}})
    report, status = run(synth, tmp_path)
    assert status == 1 and report["verdict"] == "violations"
    assert findings(report, "violations") == [("below_ack_quorum", 1, 5, 5), ("gap", 1, 10, 12)]
    assert findings(report, "reported") == [("under_replicated", 2, 4, 4)]
    below = report["violations"][0]
    assert below["invariant"] == "AllCommittedEntriesReachAckQuorum" and below["detail"].startswith("held by 1 ")
    assert below["detail"].endswith(f": {B1}")
    assert report["rule_counts"]["gap"] == {"class": "violation", "findings": 1, "entries": 3}
    assert report["replica_histogram"] == {"0": 3, "1": 1, "2": 16 + 1, "3": 19}
    assert report["totals"]["under_replicated_entries"] == 1


def test_two_copies_with_different_bytes_diverge_identical_ones_are_duplicates(synth, tmp_path):
    synth.ledger(1, 3, 3, 2, 10)
    synth.add(B2, 1, 7, variant=1)  # a second, different copy of entry 7 on B2
    synth.add(B3, 1, 3)  # an identical re-add on B3: a benign duplicate
    report, status = run(synth, tmp_path)
    assert status == 1
    assert findings(report, "violations") == [("divergence", 1, 7, 7)]
    detail = report["violations"][0]["detail"]
    assert detail.count("digest 0x") == 2 and B2 in detail and B1 in detail
    assert report["benign_counts"] == {"duplicates": 1}


def test_a_normal_add_after_the_bookies_fence_is_a_write_after_fence(synth, tmp_path):
    synth.ledger(1, 3, 3, 2, 10)
    synth.fence(B1, 1)
    synth.recovery_add(B1, 1, 9)  # recovery's write-back: allowed
    synth.add(B1, 1, 3)  # identical to B1's earlier copy: an idempotent re-add, allowed
    synth.add(B1, 1, 10, lac=8)  # a new entry from the fenced writer: the bookie must have refused it
    synth.add(B2, 1, 10, lac=8)  # the same on B2, which never saw a fence: only above last_entry_id (benign)
    paths = synth.save()
    report, status = audit([synth.root], synth.snapshot_path, tmp_path / "out")
    assert status == 1
    assert findings(report, "violations") == [("write_after_fence", 1, 10, 10)]
    v = report["violations"][0]
    assert (v["bookie"], v["file"], v["invariant"]) == (B1, paths[(B1, 1)], "FencedWriterMakesNoProgress")
    assert v["offset"] == record_offsets(paths[(B1, 1)])[-1].offset
    assert report["benign_counts"] == {"above_last_entry": 2, "duplicates": 2}


def test_lac_order_and_lac_above_the_close(synth, tmp_path):
    synth.ledger(1, 3, 3, 2, 6)
    synth.add(B1, 1, 6, lac=1)  # entry 5 carried LAC 4: the writer's LAC went back (6 is above the end)
    synth.recovery_add(B2, 1, 2)  # write-backs carry their entry's old LAC (1): not the bookie's progress
    synth.add(B3, 1, 2)  # a re-add of entry 2 (identical, LAC 1): not progress either
    synth.explicit_lac(B3, 1, 2)  # an explicit LAC sent before entry 5 may be journaled after it
    synth.ledger(2, 3, 3, 2, 5)
    synth.add(B1, 2, 7, lac=6)  # ledger 2 is CLOSED at 4, but a writer confirmed 6
    report, status = run(synth, tmp_path)
    assert status == 1
    got = sorted((f["rule"], f["ledger"], f["bookie"], f.get("first_entry")) for f in report["violations"])
    assert got == [("lac_above_last_entry", 2, B1, None), ("lac_decreased", 1, B1, 6)]
    assert report["rule_counts"]["lac_decreased"]["findings"] == 1
    lac = next(f for f in report["violations"] if f["rule"] == "lac_decreased")
    assert lac["detail"].startswith("entry 6 carries LAC 1 below LAC 4 of entry 5 (")


def test_lac_is_checked_by_entry_id_not_journal_order(synth, tmp_path):
    """Adds reach a bookie's journal out of id order (a batch held by the write-cache throttle while the next
    one journals; a pending entry resent to a replacement bookie after newer entries): legal. The writer's LAC
    never decreases and it pushes entries in id order, so a LAC lower than a lower id's is a regression wherever
    it sits in the journal."""
    md = synth.ledger(1, 3, 3, 2, 0, close=False)
    for entry_id in range(8):
        for bookie in (B1, B2):
            synth.add(bookie, 1, entry_id)  # in id order, entry e carries LAC e - 1
    for entry_id in (0, 1, 2, 3, 5, 4, 7, 6):  # B3 journals 5 before 4 and 7 before 6
        synth.add(B3, 1, entry_id)
    synth.explicit_lac(B3, 1, 3)  # a WriteLac sent when the LAC was 3, journaled after entry 6 (LAC 5)
    synth.metadata[1] = md.closed(7, 800)
    # ledger 2: the journal order looks monotonic, but entry 5 carries LAC 1 after entry 4 carried 3
    synth.ledger(2, 3, 3, 2, 0, close=False)
    for bookie in synth.bookies[:3]:
        for entry_id, lac in ((0, -1), (1, 0), (2, 1), (5, 1), (3, 2), (4, 3)):
            synth.add(bookie, 2, entry_id, lac=lac)
    synth.metadata[2] = synth.metadata[2].closed(5, 600)
    report, status = run(synth, tmp_path)
    assert status == 1
    got = sorted((f["rule"], f["ledger"], f["bookie"], f.get("first_entry")) for f in report["violations"])
    assert got == [("lac_decreased", 2, b, 5) for b in (B1, B2, B3)]
    assert all("entry 5 carries LAC 1 below LAC 3 of entry 4" in f["detail"] for f in report["violations"])


def test_benign_facts_are_counted_never_flagged(synth, tmp_path):
    synth.ledger(1, 3, 3, 2, 10, segments=[(0, (B1, B2, B3)), (5, (B1, B2, B4))])
    synth.add(B3, 1, 5)  # sent to B3 before the ensemble change replaced it
    synth.add(B3, 1, 6)
    synth.add(B1, 1, 10, lac=9)  # a fenced writer's late adds above last_entry_id
    synth.add(B1, 1, 11, lac=9)
    synth.add(B1, 99, 0)  # ledger 99 is not in the snapshot (deleted)
    synth.add(B2, 99, 0)
    report, status = run(synth, tmp_path)
    assert (status, report["verdict"]) == (0, "clean")
    assert report["violations"] == report["reported"] == []
    assert report["benign_counts"] == {"above_last_entry": 2, "outside_segment": 2, "unknown_ledger_copies": 2}
    unknown = next(lg for lg in report["ledgers"] if lg["ledger"] == 99)
    assert (unknown["state"], unknown["confirmed_end"]) == ("UNKNOWN", None)


def test_journal_damage_crc_failure_garbage_and_torn_tail(synth, tmp_path):
    synth.ledger(1, 3, 3, 2, 8)
    synth.roll(B1)
    synth.ledger(2, 3, 3, 2, 8)
    paths = synth.save()
    older = record_offsets(paths[(B1, 1)])
    flip(paths[(B1, 1)], older[2].end - 1)  # a payload byte of ledger 1's entry 2, in B1's older journal
    b2 = record_offsets(paths[(B2, 1)])
    with open(paths[(B2, 1)], "rb") as f:
        data = f.read()
    garbage = bytes(range(200, 237))
    with open(paths[(B2, 1)], "wb") as f:
        f.write(data[:b2[3].offset] + garbage + data[b2[3].offset:])
    b3 = record_offsets(paths[(B3, 1)])
    truncate(paths[(B3, 1)], b3[-1].offset + 7)  # the newest journal's last record torn
    report, status = audit([synth.root], synth.snapshot_path, tmp_path / "out")
    assert status == 1
    got = [(v["rule"], v["bookie"], v["file"], v["offset"]) for v in report["violations"]]
    assert got == [("journal_crc_failure", B1, paths[(B1, 1)], older[2].offset),
                   ("journal_garbage", B2, paths[(B2, 1)], b2[3].offset)]
    assert "claims ledger 1 entry 2" in report["violations"][0]["detail"]
    # the records after the garbage still count: entry 3 of ledger 1 (B2's 4th record) is fully replicated
    # the torn tail starts at the last group write (its frame), not at the record in it that was cut
    assert [(b["rule"], b["bookie"], b["offset"]) for b in report["benign"]] == [("torn_tail", B3, b3[-1].group)]
    # what the damage cost: entry 2 of ledger 1 on B1 and entry 7 of ledger 2 on B3, each still on 2 of 3
    assert findings(report, "reported") == [("under_replicated", 1, 2, 2), ("under_replicated", 2, 7, 7)]


def test_torn_tail_rules_follow_the_checkpoint_mark_and_replay(synth, tmp_path):
    synth.ledger(1, 3, 3, 2, 6)
    synth.roll(B2)
    synth.add(B2, 1, 5)  # a re-add in B2's journal 2, so journal 1 is an older journal
    synth.lastmarks[B1] = (1, 10**6)  # B1's checkpoint mark lies beyond its torn tail
    paths = synth.save()
    b1 = record_offsets(paths[(B1, 1)])
    truncate(paths[(B1, 1)], b1[-1].offset + 5)
    b2 = record_offsets(paths[(B2, 1)])
    truncate(paths[(B2, 1)], b2[-1].offset + 5)  # torn, but B2 wrote journal 2 after it
    b3 = record_offsets(paths[(B3, 1)])
    with open(paths[(B3, 1)], "rb") as f:
        data = f.read()
    with open(paths[(B3, 1)], "wb") as f:  # a record header whose length runs past the end, valid records after
        f.write(data[:b3[2].offset] + jfmt.RECORD_PREFIX.pack(10**7, 0, 1, 0) + data[b3[2].offset:])
    report, status = audit([synth.root], synth.snapshot_path, tmp_path / "out")
    got = [(v["rule"], v["bookie"], v["offset"]) for v in report["violations"]]
    assert got == [("journal_garbage", B3, b3[2].offset), ("journal_corrupt_tail", B2, b2[-1].offset),
                   ("torn_tail_below_checkpoint", B1, b1[-1].group)]
    assert status == 1
    assert f"then valid records from offset {b3[2].offset + jfmt.RECORD_PREFIX_BYTES}" in report["violations"][0]["detail"]
    # every record counted once, whichever scan read it (B2's older journal: the group rule up to its
    # torn-looking tail, the record-level search from there); the two torn last records are not records
    untouched = sum(len(record_offsets(p)) for k, p in paths.items() if k not in ((B1, 1), (B2, 1), (B3, 1)))
    assert untouched > 0 and report["totals"]["records"] == len(b1) - 1 + len(b2) - 1 + len(b3) + untouched

    synth.lastmarks[B2] = (2, 0)  # now journal 1 lies below B2's mark: replay has moved past it
    del synth.lastmarks[B1]
    os.remove(os.path.join(synth.root, synth.name(B1), "ledgers", "lastmark"))
    paths = synth.save()
    truncate(paths[(B1, 1)], b1[-1].offset + 5)
    truncate(paths[(B2, 1)], b2[-1].offset + 5)
    report, status = audit([synth.root], synth.snapshot_path, tmp_path / "out2")
    assert status == 0, report["violations"]
    assert sorted((b["rule"], b["bookie"]) for b in report["benign"]) == [("torn_tail", B1), ("torn_tail", B2)]


def test_journal_headers_torn_bad_and_foreign(synth, tmp_path):
    synth.ledger(1, 3, 3, 2, 4)
    synth.roll(B1)
    synth.roll(B2)
    synth.add(B2, 1, 3)
    paths = synth.save()
    with open(paths[(B1, 2)], "wb") as f:
        f.write(b"\0" * 10)  # B1's newest journal: created, header never synced
    patch(paths[(B2, 1)], 0, b"XXXX")  # B2's older journal: bad magic
    foreign = Synth(str(tmp_path / "other")).instance_id
    with open(paths[(B3, 1)], "rb") as f:
        data = f.read()
    with open(paths[(B3, 1)], "wb") as f:
        f.write(jfmt.encode_file_header(foreign) + data[jfmt.FILE_HEADER_BYTES:])
    report, status = audit([synth.root], synth.snapshot_path, tmp_path / "out")
    assert status == 1
    assert [(v["rule"], v.get("bookie")) for v in report["violations"]][:2] == [("journal_bad_header", B2),
                                                                            ("journal_foreign_instance", B3)]
    assert [(b["rule"], b["bookie"]) for b in report["benign"]] == [("torn_header", B1)]
    # B2's and B3's records are not used: with only B1 left every entry is below Qa (and reported so)
    assert findings(report, "violations")[2:] == [("below_ack_quorum", 1, 0, 2)]


def test_a_bookie_without_its_oldest_journals_makes_missing_copies_unverifiable(synth, tmp_path):
    synth.ledger(1, 3, 2, 2, 9)
    synth.journals[B1] = {2: synth.journals[B1][1]}  # B1's journal 1 was deleted; what it held is in journal 2 ...
    lost = [r for r in synth.journals[B1][2]][:3]
    synth.journals[B1][2] = synth.journals[B1][2][3:]  # ... except its first three records
    report, status = run(synth, tmp_path)
    assert status == 0 and report["violations"] == []
    assert [r["rule"] for r in report["reported"]] == ["unverifiable"] * len(report["reported"])
    assert report["totals"]["unverifiable_entries"] == 3
    assert any("journal history incomplete" in w for w in report["warnings"])
    bookie = next(b for b in report["inputs"]["bookies"] if b["bookie"] == B1)
    assert bookie["evidence"] == "partial"
    # its entry log holds the three: evidence complete, every entry counted
    for record in lost:
        synth.entry_logs.setdefault(B1, []).append(log_fmt.encode_record(record[jfmt.RECORD_PREFIX_BYTES:]))
    synth.save()
    report, status = audit([synth.root], synth.snapshot_path, tmp_path / "out2",
                           entrylogs=[os.path.join(synth.root, synth.name(B1), "ledgers")])
    assert (status, report["reported"], report["violations"]) == (0, [], [])
    assert report["totals"]["entrylog_entries"] == 3 and report["replica_histogram"] == {"2": 9}


def test_a_bad_entry_digest_is_a_bad_replica(synth, tmp_path):
    synth.ledger(1, 3, 2, 2, 4)
    good = encode_entry(1, 4, 3, 500, b"x" * 40)
    bad = good[:36] + b"y" + good[37:]  # the journal record's CRC is right, the entry's digest is not
    md = synth.metadata[1]
    synth.metadata[1] = md._replace(last_entry_id=4, length=500)
    for bookie in md.write_set(4):
        synth.record(bookie, jfmt.entry_record(bad if bookie == md.write_set(4)[0] else good, 0))
    report, status = run(synth, tmp_path)
    assert status == 1
    assert findings(report, "violations") == [("entry_digest_mismatch", 1, 4, 4), ("below_ack_quorum", 1, 4, 4)]


def test_findings_are_bounded_but_counted_exactly(synth, tmp_path):
    synth.ledger(1, 3, 2, 2, 40, skip={e: {B1} for e in range(0, 40, 2)})
    report, status = run(synth, tmp_path, findings_max=3)
    assert status == 1
    below = report["rule_counts"]["below_ack_quorum"]
    assert len(report["violations"]) == 3 and below["findings"] == report["totals"]["violations"]
    assert below["findings"] == len([e for e in range(0, 40, 2) if B1 in synth.metadata[1].write_set(e)])
    assert [v["first_entry"] for v in report["violations"]] == sorted(v["first_entry"] for v in report["violations"])


def test_inputs_bookie_of_a_directory(synth, tmp_path):
    synth.ledger(1, 3, 3, 2, 4)
    synth.roll(B1)
    synth.add(B1, 1, 3)
    synth.archived[B1] = {1}  # journal 1 moved to journal-archive/: no cookie there, its sibling's tells
    synth.save()
    report, status = audit([synth.root], synth.snapshot_path, tmp_path / "out")
    assert status == 0
    b1 = next(b for b in report["inputs"]["bookies"] if b["bookie"] == B1)
    assert b1["journals"] == 2 and len(b1["journal_dirs"]) == 2 and b1["evidence"] == "complete"

    alone = tmp_path / "alone"
    os.rename(os.path.join(synth.root, synth.name(B1), "journal-archive"), alone)
    with pytest.raises(AuditInputError, match="cannot tell which bookie"):
        audit([synth.root, alone], synth.snapshot_path, tmp_path / "out2")
    report, _ = audit([synth.root, f"{B1}={alone}"], synth.snapshot_path, tmp_path / "out3")
    assert next(b for b in report["inputs"]["bookies"] if b["bookie"] == B1)["journals"] == 2
    with pytest.raises(AuditInputError, match="its cookie names bookie"):
        audit([f"{B2}={os.path.join(synth.root, synth.name(B1), 'journal')}"], synth.snapshot_path, tmp_path / "o4")
    with pytest.raises(AuditInputError, match="no such directory"):
        audit([tmp_path / "missing"], synth.snapshot_path, tmp_path / "o5")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AuditInputError, match="no journal files"):
        audit([empty], synth.snapshot_path, tmp_path / "o6")
    with pytest.raises(AuditInputError, match="not a bksim metadata snapshot"):
        audit([synth.root], {"ledgers": []}, tmp_path / "o7")


def test_an_entry_log_copy_that_differs_from_the_journal_copy_diverges(synth, tmp_path):
    synth.ledger(1, 3, 3, 2, 6)
    synth.log_entry(B1, 1, 2)  # the same bytes as B1's journal copy: not divergence
    synth.log_entry(B2, 1, 4, variant=1)  # other bytes than B2's journal copy of entry 4
    synth.save()
    report, status = audit([synth.root], synth.snapshot_path, tmp_path / "out",
                           entrylogs=[os.path.join(synth.root, synth.name(b), "ledgers") for b in (B1, B2)])
    assert status == 1
    assert findings(report, "violations") == [("divergence", 1, 4, 4)]
    assert "entrylogs" in report["violations"][0]["detail"]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 101])
def test_header_columns_read_what_struct_reads(n):
    from bksim.audit.parse import header_columns
    from bksim.formats.entry import HEADER

    bodies = [encode_entry(7, (-1) ** i * i * 1_000_003, i - 2 ** 40, 2 ** 62 - i, bytes(i % 5)) for i in range(n)]
    ids, lacs, lengths, stored = header_columns(bodies)
    unpacked = [HEADER.unpack_from(b) for b in bodies]
    assert list(ids) == [u[1] for u in unpacked] and list(lacs) == [u[2] for u in unpacked]
    assert list(lengths) == [u[3] for u in unpacked] and list(stored) == [u[4] for u in unpacked]


def test_an_entrylogs_directory_given_on_its_own_belongs_to_the_bookie_of_the_ledger_directory_above(synth, tmp_path):
    synth.ledger(1, 3, 2, 2, 3)
    synth.log_entry(B1, 1, 0)
    synth.save()
    entrylogs = os.path.join(synth.root, synth.name(B1), "ledgers", "entrylogs")
    report, status = audit([os.path.join(synth.root, synth.name(b), "journal") for b in synth.bookies],
                           synth.snapshot_path, tmp_path / "out", entrylogs=[entrylogs])
    assert status == 0
    assert next(b for b in report["inputs"]["bookies"] if b["bookie"] == B1)["entry_logs"] == 1
