"""What both drivers share: the options, the per-ledger grouping, and writing the outputs.

A driver (local.py, spark.py) turns a Plan into (file outputs, ledger results, run facts); `finish` turns those
into report.json and report.html in the output directory and returns (report, exit status). The drivers differ
only in where `parse.parse_file` and `rules.check_ledger` run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterable

from bksim.audit import html, report as report_mod
from bksim.audit.findings import Finding
from bksim.audit.inputs import Plan
from bksim.audit.parse import FileResult
from bksim.audit.rules import FINDINGS_PER_LEDGER_MAX, LedgerResult, Piece, check_ledger
from bksim.audit.snapshot import Snapshot

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class AuditOptions:
    out_dir: str
    findings_max: int = report_mod.FINDINGS_MAX  # findings listed per class in the report
    findings_per_ledger_max: int = FINDINGS_PER_LEDGER_MAX
    parquet: bool = True  # write the records as Parquet (Spark; --local only when pyarrow is installed)


def pieces_of(result: FileResult) -> list[tuple[int, Piece]]:
    """(ledger id, Piece) for every ledger with records in the file (none when the file is unusable)."""
    if not result.usable:
        return []
    t = result.task
    return [(ledger_id, Piece(t.bookie, t.kind, t.file_id, t.path, block)) for ledger_id, block in result.blocks.items()]


def file_output(result: FileResult) -> tuple[dict, list[Finding]]:
    return result.summary(), result.findings


def check_ledgers(pieces: dict[int, list[Piece]], snapshot: Snapshot, evidence: dict[str, str],
                  per_ledger_max: int) -> list[LedgerResult]:
    """check_ledger for every ledger with records or metadata."""
    ids = sorted(set(pieces) | set(snapshot.ledgers))
    return [check_ledger(i, snapshot.ledgers.get(i), pieces.get(i, []), evidence, per_ledger_max) for i in ids]


def missing_ledgers(checked: Iterable[int], snapshot: Snapshot, evidence: dict[str, str],
                    per_ledger_max: int) -> list[LedgerResult]:
    """Results for the snapshot's ledgers that have no record anywhere (every entry of them is missing)."""
    seen = set(checked)
    return [check_ledger(i, view, [], evidence, per_ledger_max)
            for i, view in sorted(snapshot.ledgers.items()) if i not in seen]


def finish(plan: Plan, snapshot: Snapshot, files: list[tuple[dict, list[Finding]]], ledgers: list[LedgerResult],
           run: dict, options: AuditOptions) -> tuple[dict, int]:
    os.makedirs(options.out_dir, exist_ok=True)
    report = report_mod.build_report(plan, snapshot, files, ledgers, run, options.findings_max)
    out_dir = os.path.abspath(options.out_dir)
    run["outputs"] = {"report_json": os.path.join(out_dir, "report.json"),
                      "report_html": os.path.join(out_dir, "report.html"), **run.get("outputs", {})}
    report_mod.write_json(report, options.out_dir)
    html.write_html(report, options.out_dir)
    return report, report["exit_status"]
