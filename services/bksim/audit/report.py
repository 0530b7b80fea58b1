"""report.json: what the audit found, as one deterministic JSON document, and the exit status it implies.

Everything but the "run" section (mode, master, timings, where the outputs went) depends only on the inputs:
both drivers give byte-identical documents once `strip_timing` has removed it. Lists are sorted (findings by
Finding.sort_key, ledgers by id, files by path) and bounded: at most `findings_max` findings per class are
listed, while the counts ("rule_counts", "totals") stay exact.

"replicas_per_bookie": per bookie named by a write set, the entry ids at or below a confirmed end its write
sets name (`write_set_entries`), those it lacks (`missing_entries`, exact: rules.py) and its cookie
incarnation (None when its journals are not in the inputs; > 1: re-initialised, inputs.py).

Exit status: 0 clean, 1 at least one violation, 2 unusable input (raised before a report exists).
"""
from __future__ import annotations

import copy
import json
import os
from collections import Counter

from bksim.audit.findings import BENIGN, REPORTED, RULES, VIOLATION, Finding, sorted_findings
from bksim.audit.inputs import Plan
from bksim.audit.rules import LedgerResult
from bksim.audit.snapshot import Snapshot

REPORT_FORMAT = "bksim-audit-report"
REPORT_VERSION = 1
FINDINGS_MAX = 10_000  # findings listed per class in report.json (counts stay exact)
TIMING_KEYS = ("run",)  # the only keys whose values may differ between drivers and runs

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_UNUSABLE = 0, 1, 2


def strip_timing(report: dict) -> dict:
    """The report without what depends on how and when it was made (the "run" section): what two drivers
    must agree on byte for byte."""
    out = copy.deepcopy(report)
    for key in TIMING_KEYS:
        out.pop(key, None)
    return out


def build_report(plan: Plan, snapshot: Snapshot, files: list[tuple[dict, list[Finding]]],
                 ledgers: list[LedgerResult], run: dict, findings_max: int = FINDINGS_MAX) -> dict:
    """`files`: (FileResult.summary(), its findings) per file; `ledgers`: one LedgerResult per ledger."""
    files = sorted(files, key=lambda f: f[0]["file"])
    ledgers = sorted(ledgers, key=lambda r: r.ledger)
    rule_counts: Counter = Counter()
    rule_entries: Counter = Counter()
    listed: list[Finding] = []
    for _, found in files:
        for f in found:
            rule_counts[f.rule] += 1
            rule_entries[f.rule] += f.entries
        listed += found
    for result in ledgers:
        for rule, (n, entries) in result.rule_counts.items():
            rule_counts[rule] += n
            rule_entries[rule] += entries
        listed += result.findings
    by_class: dict[str, list[dict]] = {VIOLATION: [], REPORTED: [], BENIGN: []}
    for f in sorted_findings(listed):
        if len(by_class[f.kind]) < findings_max:
            by_class[f.kind].append(f.to_json())

    histogram: Counter = Counter()
    benign_counts: Counter = Counter()
    for result in ledgers:
        histogram.update(result.histogram)
        benign_counts.update(result.benign)
    for rule, n in rule_counts.items():
        if RULES[rule][0] == BENIGN:
            benign_counts[rule] += n
    violations = sum(n for rule, n in rule_counts.items() if RULES[rule][0] == VIOLATION)

    per_bookie: dict[str, dict] = {}
    records_by_type: Counter = Counter()
    for summary, _ in files:
        row = per_bookie.setdefault(summary["bookie"], {"bookie": summary["bookie"], "journal_bytes": 0,
                                                        "entrylog_bytes": 0, "journal_records": 0,
                                                        "entrylog_records": 0, "payload_bytes": 0})
        row[f"{summary['kind']}_bytes"] += summary["bytes"]
        row[f"{summary['kind']}_records"] += summary["records"]
        row["payload_bytes"] += summary["payload_bytes"]
        if summary["kind"] == "journal":
            records_by_type.update(summary["counts"])
    copies_per_bookie: Counter = Counter()
    write_set_entries: Counter = Counter()
    missing_entries: Counter = Counter()
    for result in ledgers:
        copies_per_bookie.update(result.copies_per_bookie)
        write_set_entries.update(result.write_set_entries)
        missing_entries.update(result.missing_entries)
    incarnations = {b: inputs.incarnation for b, inputs in plan.bookies.items()}
    replicas_per_bookie = [{"bookie": b, "write_set_entries": write_set_entries.get(b, 0),
                            "missing_entries": missing_entries.get(b, 0), "incarnation": incarnations.get(b)}
                           for b in sorted(set(write_set_entries) | set(missing_entries))]
    for bookie, row in per_bookie.items():
        row["copies"] = copies_per_bookie.get(bookie, 0)

    warnings = list(plan.warnings) + [f"unreadable ledger metadata: {p}" for p in snapshot.problems]
    for bookie, inputs in plan.bookies.items():
        warnings += [f"bookie {bookie}: {note}" for note in inputs.notes]
    named = {b for view in snapshot.ledgers.values() for _, ensemble in view.segments for b in ensemble}
    absent = sorted(named - set(plan.bookies))
    if absent:
        warnings.append(f"{len(absent)} bookie(s) named by ledger metadata have no journals in the inputs "
                        f"({', '.join(absent[:20])}{', ...' if len(absent) > 20 else ''}): entries that need them "
                        f"are reported as unverifiable, never as missing")

    states = Counter(r.state for r in ledgers)
    totals = {
        "bookies": len(plan.bookies), "files": len(files),
        "journal_files": sum(1 for s, _ in files if s["kind"] == "journal"),
        "entrylog_files": sum(1 for s, _ in files if s["kind"] == "entrylog"),
        "bytes": sum(s["bytes"] for s, _ in files),
        "records": sum(s["records"] for s, _ in files if s["kind"] == "journal"),
        "records_by_type": dict(sorted(records_by_type.items())),
        "entrylog_entries": sum(s["records"] for s, _ in files if s["kind"] == "entrylog"),
        "payload_bytes": sum(s["payload_bytes"] for s, _ in files),
        "ledgers": len(ledgers), "ledgers_by_state": dict(sorted(states.items())),
        "entries": sum(r.entries for r in ledgers), "copies": sum(r.copies for r in ledgers),
        "entries_checked": sum(histogram.values()),
        "violations": violations,
        "under_replicated_entries": rule_entries.get("under_replicated", 0),
        "unverifiable_entries": rule_entries.get("unverifiable", 0),
    }
    return {
        "format": REPORT_FORMAT, "version": REPORT_VERSION,
        "verdict": "violations" if violations else "clean",
        "exit_status": EXIT_VIOLATIONS if violations else EXIT_CLEAN,
        "totals": totals,
        "rule_counts": {rule: {"class": RULES[rule][0], "findings": rule_counts[rule], "entries": rule_entries[rule]}
                        for rule in RULES if rule_counts.get(rule)},
        "replica_histogram": {str(k): v for k, v in sorted(histogram.items())},
        "benign_counts": dict(sorted((k, v) for k, v in benign_counts.items() if v)),
        "violations": by_class[VIOLATION],
        "reported": by_class[REPORTED],
        "benign": by_class[BENIGN],
        "warnings": warnings,
        "inputs": {"bookies": [inputs.to_json() for inputs in plan.bookies.values()],
                   "metadata": snapshot.summary()},
        "per_bookie": [per_bookie[b] for b in sorted(per_bookie)],
        "replicas_per_bookie": replicas_per_bookie,
        "ledgers": [r.to_json() for r in ledgers],
        "files": [summary for summary, _ in files],
        "run": run,
    }


def write_json(report: dict, out_dir: str) -> str:
    path = os.path.join(out_dir, "report.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return path
