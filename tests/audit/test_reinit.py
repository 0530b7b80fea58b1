"""The audit after a bookie was wiped and re-initialised (`bksim bookie format`, cookie incarnation 2): the entries
that lost their copy on it are its missing copies (under_replicated, below_ack_quorum), never unverifiable and
never clean; every replica finding names the write-set bookies that lack the copy; per bookie the report counts
the entries its write sets name and those it lacks, exactly (also for striped ensembles, E > Qw).
"""
from __future__ import annotations

import itertools
import os

import pytest

from audit.conftest import audit
from audit.synth import Synth
from bksim.audit.rules import _in_write_sets
from bksim.bookie.cookie import Cookie, encode as encode_cookie
from bksim.chaos.wipe import judge_audit
from bksim.ledger.quorum import write_set_indexes

B1, B2, B3, B4 = Synth.bookies


def set_incarnation(synth: Synth, bookie: str, journal: int, ledgers: int) -> None:
    home = os.path.join(synth.root, synth.name(bookie))
    j, lg = os.path.join(home, "journal"), os.path.join(home, "ledgers")
    for d, incarnation in ((j, journal), (lg, ledgers)):
        with open(os.path.join(d, "COOKIE"), "wb") as f:
            f.write(encode_cookie(Cookie(bookie, synth.instance_id, j, lg, incarnation=incarnation)))


@pytest.fixture
def wiped(tmp_path):
    """B2 held copies of ledgers 1 (3/3/2) and 2 (2/2/2), was wiped and re-initialised, then took ledger 4."""
    synth = Synth(str(tmp_path / "cluster"))
    synth.ledger(1, 3, 3, 2, 10)  # B1 B2 B3
    synth.ledger(2, 2, 2, 2, 8)  # B1 B2
    synth.ledger(3, 2, 2, 2, 5, segments=[(0, (B3, B4))])  # never on B2
    synth.journals[B2] = {1: []}  # the wipe: the new incarnation's journal ids restart at 1
    synth.ledger(4, 3, 3, 2, 4)  # written after the re-initialisation: B2 holds it
    synth.save()
    set_incarnation(synth, B2, 2, 2)
    return synth


def test_a_reinitialised_bookies_lost_copies_are_missing_copies_not_unverifiable(wiped, tmp_path):
    report, status = audit([wiped.root], wiped.snapshot_path, tmp_path / "out")
    assert status == 1 and report["verdict"] == "violations"
    rows = [(f["rule"], f["ledger"], f["first_entry"], f["last_entry"], f["missing"])
            for f in report["violations"] + report["reported"]]
    assert rows == [("below_ack_quorum", 2, 0, 7, [B2]), ("under_replicated", 1, 0, 9, [B2])]
    assert report["totals"]["unverifiable_entries"] == 0 and report["totals"]["under_replicated_entries"] == 10
    b2 = next(b for b in report["inputs"]["bookies"] if b["bookie"] == B2)
    assert (b2["evidence"], b2["incarnation"], b2["journal_ids"]) == ("complete", 2, [1, 1])
    assert any("re-initialised (cookie incarnation 2" in n for n in b2["notes"])
    assert next(b for b in report["inputs"]["bookies"] if b["bookie"] == B1)["incarnation"] == 1
    per_bookie = {r["bookie"]: (r["write_set_entries"], r["missing_entries"], r["incarnation"])
                  for r in report["replicas_per_bookie"]}
    assert per_bookie == {B1: (10 + 8 + 4, 0, 1), B2: (10 + 8 + 4, 10 + 8, 2), B3: (10 + 5 + 4, 0, 1),
                          B4: (5, 0, 1)}
    ledgers = {lg["ledger"]: lg for lg in report["ledgers"]}
    assert ledgers[2]["missing_entries"] == {B2: 8} and "missing_entries" not in ledgers[3]

    problems, figures = judge_audit(report, B2)
    assert problems == []
    assert figures | {"violations": None} == {"entries_lost_replica": 18, "below_qa": 8, "under_replicated": 10,
                                              "gap": 0, "write_set_entries": 22, "incarnation": 2,
                                              "violations": None, "other_findings": 0}
    assert figures["violations"] == 1
    # the same report judged for another bookie: every finding is a problem, and that bookie lost nothing
    problems, _ = judge_audit(report, B1)
    assert len(problems) >= 3 and any(f"bookie {B2} (not wiped) lacks 18" in p for p in problems)
    assert any("write sets of 22 confirmed entries name" in p for p in problems)


def test_directories_of_two_incarnations_are_warned_about(wiped, tmp_path):
    set_incarnation(wiped, B2, 2, 1)  # the ledger directory kept the old incarnation's cookie
    report, _ = audit([wiped.root], wiped.snapshot_path, tmp_path / "out")
    assert any(f"bookie {B2}: its cookies name incarnations [1, 2]" in w for w in report["warnings"])
    assert next(b for b in report["inputs"]["bookies"] if b["bookie"] == B2)["incarnation"] == 2


def test_missing_names_the_write_set_in_a_striped_ensemble(tmp_path):
    synth = Synth(str(tmp_path / "cluster"))
    # 3/2/2: entry e goes to ensemble indexes e % 3 and (e + 1) % 3; B3 (index 2) took nothing; 9..11 are lost
    md = synth.ledger(1, 3, 2, 2, 12, skip={e: ({B3} if e < 9 else {B1, B2, B3}) for e in range(12)})
    synth.save()
    report, status = audit([synth.root], synth.snapshot_path, tmp_path / "out")
    assert status == 1
    on_b3 = [e for e in range(9) if B3 in md.write_set(e)]
    below = [(f["first_entry"], f["missing"]) for f in report["violations"] if f["rule"] == "below_ack_quorum"]
    assert below == [(e, [B3]) for e in on_b3]
    (gap,) = [f for f in report["violations"] if f["rule"] == "gap"]
    assert (gap["first_entry"], gap["last_entry"], gap["missing"]) == (9, 11, sorted([B1, B2, B3]))
    per_bookie = {r["bookie"]: (r["write_set_entries"], r["missing_entries"]) for r in report["replicas_per_bookie"]}
    expected = {b: sum(1 for e in range(12) if b in md.write_set(e)) for b in (B1, B2, B3)}
    assert per_bookie == {B1: (expected[B1], 2), B2: (expected[B2], 2), B3: (expected[B3], expected[B3])}


@pytest.mark.parametrize("e, qw", [(1, 1), (2, 1), (3, 2), (3, 3), (5, 2), (5, 4)])
def test_write_set_counting_matches_the_write_sets(e, qw):
    for lo, hi in itertools.combinations_with_replacement(range(0, 13), 2):
        for index in range(e):
            brute = sum(1 for entry in range(lo, hi + 1) if index in write_set_indexes(entry, e, qw))
            assert _in_write_sets(index, lo, hi, e, qw) == brute, (index, lo, hi)
