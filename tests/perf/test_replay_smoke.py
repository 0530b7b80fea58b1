"""Smoke test of `bksim perf replay` at a tiny size: the report parses and its figures hang together (never a speed).
It is bounded by --size (no --seconds), so not conftest's run_perf."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from perf.perf_smoke_checks import assert_figures

RUN_TIMEOUT_S = 120.0
ENTRY_BYTES = 512
SIZE_BYTES = 2_000_000
LEDGERS = 16


def test_replay_reports_parse_replay_and_their_ratios(tmp_path, repo_root):
    base = tmp_path / "perf"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "replay", "--json", "--idle-min", "0", "--idle-wait-s",
            "0", "--dir", str(base), "--size", str(SIZE_BYTES), "--entry-size", str(ENTRY_BYTES)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads(done.stdout)
    assert report["benchmark"] == "replay"
    assert "rec/s" in done.stderr and "crashed without a checkpoint" in done.stderr
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"

    parse, replayed, alone = report["results"]
    records = SIZE_BYTES // ENTRY_BYTES + LEDGERS  # every entry, and one MASTER_KEY record per ledger
    assert_figures(parse, "journal-parse", records, ENTRY_BYTES, 1)
    assert_figures(replayed, "journal-replay", records, ENTRY_BYTES, 1)
    assert_figures(alone, "replay-only", records, ENTRY_BYTES, 1)
    assert parse["journal_bytes"] > SIZE_BYTES and parse["journals"] == replayed["journals"] == 1
    assert alone["elapsed_s"] <= replayed["elapsed_s"]
    assert abs(alone["elapsed_s"] - replayed["replay_s"]) < 1e-3
    assert replayed["checkpoints"] >= 1  # at least the one start() ends with
    assert abs(replayed["open_s"] + replayed["replay_s"] + replayed["after_s"] - replayed["elapsed_s"]) < 1e-3
    assert replayed["rss_before_mb"] > 0 and replayed["rss_after_mb"] > 0

    ratios = {(q["subject"], q["baseline"]): q for q in report["ratios"]}
    assert set(ratios) == {("journal-replay", "journal-parse"), ("replay-only", "journal-parse")}
    for (subject, _), q in ratios.items():
        result = replayed if subject == "journal-replay" else alone
        assert q["target"] == 0.5 and isinstance(q["met"], bool)
        assert abs(q["ratio"] - result["records_per_s"] / parse["records_per_s"]) < 1e-3
    assert "ratio journal-replay / journal-parse (records/s)" in done.stderr
