"""The --local driver: the same parse and rules in this one Python process, over local files.

Reads one file at a time (memory: the largest file plus the columnar blocks, ~60 bytes per record). Parquet
of the records is written only when pyarrow is installed (the report's "run" section says which); the report
itself is the one the Spark driver writes.
"""
from __future__ import annotations

import os
import time

from bksim.audit.inputs import Plan
from bksim.audit.job import (AuditOptions, Progress, check_ledgers, file_output, pieces_of)
from bksim.audit.parse import RECORD_COLUMNS, parse_file, record_rows
from bksim.audit.rules import Piece
from bksim.audit.snapshot import AuditInputError, Snapshot

PROGRESS_INTERVAL_S = 1.0


class LocalFiles:
    """FileSource over the local file system (paths only: no URIs in --local mode)."""

    def list(self, root: str) -> list[tuple[str, int]]:
        if "://" in root or root.startswith("file:"):
            raise AuditInputError(f"{root}: --local reads local directories only (use Spark for other file systems)")
        top = os.path.abspath(root)
        if not os.path.isdir(top):
            raise AuditInputError(f"{root}: no such directory")
        out = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                try:
                    out.append((path, os.path.getsize(path)))
                except OSError:
                    pass  # maybe: removed while we listed (a bookie still running)
        return out

    def read(self, uris: list[str]) -> dict[str, bytes]:
        out = {}
        for uri in uris:
            with open(uri, "rb") as f:
                out[uri] = f.read()
        return out


def run_local(plan: Plan, snapshot: Snapshot, options: AuditOptions, progress: Progress) -> tuple[list, list, dict]:
    started = time.perf_counter()
    files = []
    pieces: dict[int, list[Piece]] = {}
    rows = [] if options.parquet and _pyarrow() is not None else None
    total = plan.total_bytes
    done_bytes = 0
    last = started
    for i, task in enumerate(plan.tasks, 1):
        with open(task.uri, "rb") as f:
            data = f.read()
        result = parse_file(task, data)
        del data
        files.append(file_output(result))
        for ledger_id, piece in pieces_of(result):
            pieces.setdefault(ledger_id, []).append(piece)
        if rows is not None:
            rows.extend(record_rows(result))
        done_bytes += task.size
        now = time.perf_counter()
        if now - last >= PROGRESS_INTERVAL_S or i == len(plan.tasks):
            progress(f"parsed {i}/{len(plan.tasks)} files, {done_bytes / 1e6:,.1f} of {total / 1e6:,.1f} MB")
            last = now
    parsed = time.perf_counter()
    progress(f"checking {len(set(pieces) | set(snapshot.ledgers))} ledgers")
    ledgers = check_ledgers(pieces, snapshot, plan.evidence(), options.findings_per_ledger_max)
    checked = time.perf_counter()
    outputs: dict = {}
    if rows is not None:
        path = os.path.join(options.out_dir, "records.parquet")
        _write_parquet(rows, path)
        outputs["records_parquet"] = path
    else:
        outputs["records_parquet"] = None
        outputs["records_parquet_skipped"] = ("pyarrow is not installed: --local writes no Parquet (the Spark "
                                              "driver does)" if options.parquet else "--no-parquet")
    run = {"mode": "local", "master": None,
           "timing_s": {"parse": round(parsed - started, 3), "check": round(checked - parsed, 3),
                        "parquet": round(time.perf_counter() - checked, 3),
                        "job": round(time.perf_counter() - started, 3)},
           "outputs": outputs}
    return files, ledgers, run


def _pyarrow():
    try:
        import pyarrow  # noqa: F401  (optional: only for Parquet in --local mode)
        import pyarrow.parquet
        return pyarrow
    except ImportError:
        return None


def _write_parquet(rows: list[tuple], path: str) -> None:
    pa = _pyarrow()
    types = {"string": pa.string(), "long": pa.int64(), "int": pa.int32()}
    columns = list(zip(*rows)) if rows else [[] for _ in RECORD_COLUMNS]
    table = pa.table({name: pa.array(list(col), type=types[kind]) for (name, kind), col in zip(RECORD_COLUMNS, columns)})
    import pyarrow.parquet as pq
    pq.write_table(table, path)
