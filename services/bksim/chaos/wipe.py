"""The "wiped bookie directory" fault: wipe a stopped bookie's directories, and judge the audit after
the operator re-initialised it.

The fault, as a run does it: kill -9 a bookie; `wipe_bookie(home)` (its journal and ledger directories lose
everything, cookies included, the directories stay); the restart must fail (the cookie check: ZooKeeper has a
cookie, the directories none); the operator runs `bksim bookie format --delete-cookie --force`; the restart
registers a new bookie with the same id (cookie incarnation 2). Nothing re-replicates yet (autorecovery comes
later), so every entry whose write set named the bookie before the wipe has lost that copy.

`judge_audit(report, wiped_bookie_id)` reads the audit's report.json (as a dict) and says whether the audit saw
exactly that: every finding that is not benign is a missing copy on the wiped bookie and on no other (a
`gap`, `below_ack_quorum` or `under_replicated` finding whose `missing` is just that bookie), and, when the
bookie's write sets name confirmed entries, it lacks at least one of them (a wipe after the bookie took writes
must leave a trace; a wipe before that is outside what this judges). Anything else is a problem: divergence,
CRC or header damage, a write after a fence, a LAC going back, an unverifiable range, a missing copy on
another bookie, a listing too truncated to attribute every finding, figures that do not add up.

Pure: files and a dict in, strings and numbers out (no processes, no ZooKeeper). The rule names are those of
audit/findings.py; report.json is the interface (chaos does not import audit).
"""
from __future__ import annotations

import os
import shutil

# audit rules whose findings are missing copies (audit/rules.py MISSING_COPY_RULES), and their figure names
MISSING_COPY_FIGURES = {"below_ack_quorum": "below_qa", "under_replicated": "under_replicated", "gap": "gap"}
NON_BENIGN_CLASSES = ("violations", "reported")
PROBLEMS_LISTED_MAX = 20  # problems named one by one; the rest are counted


def wipe_bookie(home: str) -> str:
    """Delete everything under <home>/journal and <home>/ledgers (the directories stay, empty); say what went."""
    parts = []
    for name in ("journal", "ledgers"):
        directory = os.path.join(home, name)
        files = size = 0
        if os.path.isdir(directory):
            for entry in sorted(os.listdir(directory)):
                path = os.path.join(directory, entry)
                if os.path.isdir(path) and not os.path.islink(path):
                    for dirpath, _, filenames in os.walk(path):
                        for f in filenames:
                            files += 1
                            size += _size(os.path.join(dirpath, f))
                    shutil.rmtree(path)
                else:
                    files += 1
                    size += _size(path)
                    os.remove(path)
        os.makedirs(directory, exist_ok=True)
        parts.append(f"{name}/ {files} file{'s' if files != 1 else ''} ({size:,} bytes)")
    return f"wiped {home}: removed {', '.join(parts)}"


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def judge_audit(report: dict, wiped_bookie_id: str) -> tuple[list[str], dict]:
    """(problems, figures) for an audit run after `wiped_bookie_id` was wiped and re-initialised (module docstring).

    figures: entries_lost_replica (ids the wiped bookie's write sets name and it lacks: the audit's exact
    count), below_qa / under_replicated / gap (entries of the findings attributed to it, by rule),
    write_set_entries (confirmed ids its write sets name), incarnation (its cookie's, as the audit read it),
    violations (the audit's total), other_findings (findings that are problems).
    """
    problems: list[str] = []
    figures = {"entries_lost_replica": 0, "below_qa": 0, "under_replicated": 0, "gap": 0, "write_set_entries": 0,
               "incarnation": None, "violations": report.get("totals", {}).get("violations", 0),
               "other_findings": 0}
    listed = [f for kind in NON_BENIGN_CLASSES for f in report.get(kind, [])]
    others = []
    for f in listed:
        figure = MISSING_COPY_FIGURES.get(f.get("rule"))
        if figure is not None and f.get("missing") == [wiped_bookie_id]:
            figures[figure] += f.get("entries", 0)
        else:
            others.append(f)
    figures["other_findings"] = len(others)
    for f in others[:PROBLEMS_LISTED_MAX]:
        problems.append(f"audit {f.get('class', '?')} {_describe(f)} is not a missing copy on {wiped_bookie_id}")
    if len(others) > PROBLEMS_LISTED_MAX:
        problems.append(f"... and {len(others) - PROBLEMS_LISTED_MAX} more findings that are not missing copies on "
                        f"{wiped_bookie_id}")

    counted = sum(c.get("findings", 0) for c in report.get("rule_counts", {}).values() if c.get("class") != "benign")
    if counted > len(listed):
        problems.append(f"the report lists {len(listed)} of its {counted} non-benign findings (the audit's "
                        f"--findings-max): the rest cannot be attributed")

    if "replicas_per_bookie" not in report:
        problems.append("the report has no replicas_per_bookie section (an older audit): missing copies cannot be "
                        "counted per bookie")
    rows = {r["bookie"]: r for r in report.get("replicas_per_bookie", [])}
    mine = rows.get(wiped_bookie_id)  # None: no confirmed entry's write set names it, so it lost nothing
    if mine is not None:
        figures["entries_lost_replica"] = mine.get("missing_entries", 0)
        figures["write_set_entries"] = mine.get("write_set_entries", 0)
        figures["incarnation"] = mine.get("incarnation")
    for bookie, row in sorted(rows.items()):
        if bookie != wiped_bookie_id and row.get("missing_entries"):
            problems.append(f"bookie {bookie} (not wiped) lacks {row['missing_entries']} entries its write sets name")
    attributed = figures["below_qa"] + figures["under_replicated"] + figures["gap"]
    if not problems and attributed != figures["entries_lost_replica"]:
        problems.append(f"the findings attributed to {wiped_bookie_id} cover {attributed} entries, but the audit "
                        f"counts {figures['entries_lost_replica']} missing copies of it")
    if figures["write_set_entries"] and not figures["entries_lost_replica"]:
        problems.append(f"the write sets of {figures['write_set_entries']} confirmed entries name {wiped_bookie_id} "
                        f"and it lacks none: the wipe left no trace in the audit (were journals of its earlier "
                        f"incarnation among the inputs, or was it not wiped?)")
    return problems, figures


def _describe(f: dict) -> str:
    where = [f["rule"]]
    if "ledger" in f:
        where.append(f"ledger {f['ledger']}")
    if "first_entry" in f:
        where.append(f"entries {f['first_entry']}..{f['last_entry']}")
    if f.get("missing"):
        where.append(f"missing on {', '.join(f['missing'])}")
    if "bookie" in f:
        where.append(f"bookie {f['bookie']}")
    if "file" in f:
        where.append(f"{f['file']}@{f.get('offset')}")
    return " ".join(where) + (f" ({f['detail']})" if f.get("detail") else "")
