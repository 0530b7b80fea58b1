"""Smoke test of `bksim perf compaction` at a tiny size: the report parses and its figures hang together (never a
speed). It has its own bounds (--log-mb, --seconds >= some), so not conftest's run_perf."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from perf.perf_smoke_checks import assert_figures

RUN_TIMEOUT_S = 120.0
ENTRY_BYTES = 256


def test_compaction_reports_scan_compaction_and_the_writer_phases(tmp_path, repo_root):
    base = tmp_path / "perf"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "compaction", "--json", "--idle-min", "0",
            "--idle-wait-s", "0", "--dir", str(base), "--log-mb", "1", "--live", "0.5", "--entry-size",
            str(ENTRY_BYTES), "--seconds", "0.5", "--writer-rate", "200", "--during-logs", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads(done.stdout)
    assert report["benchmark"] == "compaction"
    assert "rec/s" in done.stderr and "# fill: 50 of 100 ledgers live" in done.stderr
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"

    scan, compaction, without, during = report["results"]
    assert_figures(scan, "entrylog-scan", scan["records"], ENTRY_BYTES, 1)
    assert_figures(compaction, "compaction", compaction["records"], ENTRY_BYTES, 1)
    # the scan read every record of the 1 MiB log; compaction copied the live half of them, and nothing else
    assert scan["records"] * (ENTRY_BYTES + 4) >= 1024 * 1024 - (ENTRY_BYTES + 4)
    assert 0.3 < compaction["live_ratio"] < 0.7
    assert compaction["bytes_copied"] == compaction["records"] * (ENTRY_BYTES + 4)
    assert abs(compaction["records"] - compaction["live_ratio"] * scan["records"]) <= 1
    assert compaction["bytes_freed"] + compaction["bytes_copied"] == compaction["log_bytes"]
    for phase, name in ((without, "writer-without-compaction"), (during, "writer-during-compaction")):
        assert_figures(phase, name, phase["records"], ENTRY_BYTES, 1)
        assert phase["records"] == phase["adds"] > 0  # every add acknowledged
    assert during["logs_compacted"] == 1 and during["entries_copied"] > 0

    [q] = report["ratios"]
    assert (q["subject"], q["baseline"], q["target"]) == ("compaction", "entrylog-scan", 0.5)
    assert abs(q["ratio"] - compaction["records_per_s"] / scan["records_per_s"]) < 1e-3
    copy_target, p99_target = report["targets"]
    assert "raw entry-log scan" in copy_target["target"] and isinstance(copy_target["met"], bool)
    assert "p99" in p99_target["target"] and isinstance(p99_target["met"], bool)
