"""chaos/wipe.py without processes: wipe_bookie on real files, judge_audit on small hand-made report dicts (the
real reports are judged in tests/audit/test_reinit.py and tests/chaos/test_wipe.py)."""
from __future__ import annotations

import os

import pytest

from bksim.chaos.wipe import judge_audit, wipe_bookie

W, A, B = "127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"


def test_wipe_bookie_empties_journal_and_ledgers_and_keeps_the_directories(tmp_path):
    home = tmp_path / "bookie-1"
    (home / "journal").mkdir(parents=True)
    (home / "ledgers" / "entrylogs").mkdir(parents=True)
    (home / "journal" / "COOKIE").write_bytes(b"c" * 10)
    (home / "journal" / "0000000000000001.txn").write_bytes(b"j" * 100)
    (home / "ledgers" / "COOKIE").write_bytes(b"c" * 10)
    (home / "ledgers" / "entrylogs" / "1.log").write_bytes(b"e" * 1000)
    (home / "other").mkdir()
    (home / "other" / "keep").write_bytes(b"k")
    line = wipe_bookie(str(home))
    assert line == f"wiped {home}: removed journal/ 2 files (110 bytes), ledgers/ 2 files (1,010 bytes)"
    assert os.listdir(home / "journal") == [] and os.listdir(home / "ledgers") == []
    assert (home / "other" / "keep").read_bytes() == b"k"  # only the two directories
    assert wipe_bookie(str(home)) == f"wiped {home}: removed journal/ 0 files (0 bytes), ledgers/ 0 files (0 bytes)"


def finding(rule, cls, ledger=1, first=0, last=9, missing=None, **extra):
    f = {"rule": rule, "class": cls, "ledger": ledger, "first_entry": first, "last_entry": last,
         "entries": last - first + 1, "detail": "d", **extra}
    if missing is not None:
        f["missing"] = missing
    return f


def report(violations=(), reported=(), benign=(), replicas=None, rule_counts=None):
    violations, reported, benign = list(violations), list(reported), list(benign)
    if rule_counts is None:
        rule_counts = {}
        for f in violations + reported + benign:
            c = rule_counts.setdefault(f["rule"], {"class": f["class"], "findings": 0, "entries": 0})
            c["findings"] += 1
    if replicas is None:
        lost = sum(f.get("entries", 0) for f in violations + reported if f.get("missing") == [W])
        replicas = [{"bookie": W, "write_set_entries": 30, "missing_entries": lost, "incarnation": 2},
                    {"bookie": A, "write_set_entries": 30, "missing_entries": 0, "incarnation": 1}]
    return {"totals": {"violations": len(violations)}, "violations": violations, "reported": reported,
            "benign": benign, "rule_counts": rule_counts, "replicas_per_bookie": replicas}


def test_missing_copies_on_the_wiped_bookie_only_are_no_problem():
    r = report(violations=[finding("below_ack_quorum", "violation", 2, 0, 4, [W])],
               reported=[finding("under_replicated", "reported", 1, 0, 9, [W]),
                         finding("under_replicated", "reported", 1, 12, 13, [W])],
               benign=[finding("torn_tail", "benign", bookie=A)])
    problems, figures = judge_audit(r, W)
    assert problems == []
    assert figures == {"entries_lost_replica": 17, "below_qa": 5, "under_replicated": 12, "gap": 0,
                       "write_set_entries": 30, "incarnation": 2, "violations": 1, "other_findings": 0}


def test_a_gap_whose_write_set_was_only_the_wiped_bookie_is_its_missing_copy():
    problems, figures = judge_audit(report(violations=[finding("gap", "violation", 3, 0, 2, [W])]), W)
    assert problems == [] and figures["gap"] == 3 and figures["entries_lost_replica"] == 3


@pytest.mark.parametrize("bad, words", [
    (finding("divergence", "violation", 1, 4, 4, bookie=A, file="/x.txn", offset=9), "divergence ledger 1 entries 4..4"),
    (finding("journal_crc_failure", "violation", bookie=A, file="/x.txn", offset=7), "journal_crc_failure"),
    (finding("write_after_fence", "violation", bookie=A), "write_after_fence"),
    (finding("lac_decreased", "violation", bookie=W), "lac_decreased"),
    (finding("unverifiable", "reported", 1, 0, 9, [W]), "unverifiable ledger 1 entries 0..9 missing on"),
    (finding("gap", "violation", 1, 0, 9, [A, W]), f"gap ledger 1 entries 0..9 missing on {A}, {W}"),
    (finding("under_replicated", "reported", 1, 0, 9, [A]), f"missing on {A}"),
    (finding("below_ack_quorum", "violation", 1, 0, 9), "below_ack_quorum"),  # no `missing`: cannot attribute
])
def test_any_other_finding_is_a_problem(bad, words):
    ok = finding("under_replicated", "reported", 2, 0, 9, [W])
    is_violation = bad["class"] == "violation"
    r = report(violations=[bad] if is_violation else [], reported=([] if is_violation else [bad]) + [ok])
    problems, figures = judge_audit(r, W)
    assert len(problems) >= 1 and words in problems[0] and f"is not a missing copy on {W}" in problems[0], problems
    assert figures["other_findings"] == 1 and figures["under_replicated"] == 10


def test_another_bookie_lacking_copies_is_a_problem_even_when_the_listing_hides_it():
    r = report(reported=[finding("under_replicated", "reported", 1, 0, 9, [W])])
    r["replicas_per_bookie"][1]["missing_entries"] = 4
    r["rule_counts"]["under_replicated"]["findings"] = 2  # one finding was not listed (--findings-max)
    problems, _ = judge_audit(r, W)
    assert any("lists 1 of its 2 non-benign findings" in p for p in problems)
    assert any(f"bookie {A} (not wiped) lacks 4 entries" in p for p in problems)


def test_a_wipe_that_left_no_trace_is_a_problem():
    problems, figures = judge_audit(report(), W)
    assert figures["entries_lost_replica"] == 0 and figures["write_set_entries"] == 30
    assert problems == [f"the write sets of 30 confirmed entries name {W} and it lacks none: the wipe left no trace "
                        f"in the audit (were journals of its earlier incarnation among the inputs, or was it not "
                        f"wiped?)"]
    # a bookie no confirmed entry names lost nothing: nothing to find
    assert judge_audit(report(replicas=[]), W) == ([], {"entries_lost_replica": 0, "below_qa": 0,
                                                       "under_replicated": 0, "gap": 0, "write_set_entries": 0,
                                                       "incarnation": None, "violations": 0, "other_findings": 0})


def test_figures_that_do_not_add_up_are_a_problem():
    r = report(reported=[finding("under_replicated", "reported", 1, 0, 9, [W])])
    r["replicas_per_bookie"][0]["missing_entries"] = 11
    problems, _ = judge_audit(r, W)
    assert problems == [f"the findings attributed to {W} cover 10 entries, but the audit counts 11 missing copies of it"]


def test_a_report_without_per_bookie_replicas_is_a_problem():
    r = report(reported=[finding("under_replicated", "reported", 1, 0, 9, [W])])
    del r["replicas_per_bookie"]
    problems, _ = judge_audit(r, W)
    assert any("no replicas_per_bookie section" in p for p in problems)
