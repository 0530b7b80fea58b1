"""Smoke test of `bksim perf cursor-holes` (bounded by --entries; no --seconds, so not conftest's run_perf): a
small topic, the report's figures and the target line, nothing left behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys

RUN_TIMEOUT_S = 240.0


def test_cursor_holes_reports_sizes_and_times_and_every_hole_back(tmp_path, repo_root):
    base = tmp_path / "perf"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "cursor-holes", "--json", "--idle-min", "0",
            "--idle-wait-s", "0", "--dir", str(base), "--entries", "20001", "--ledger-entries", "3000"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads(done.stdout)
    assert report["benchmark"] == "cursor-holes"
    ack, persist, kill, close, clean = report["results"]
    assert [r["name"] for r in report["results"]] == ["cursor-ack", "cursor-persist", "recover-kill", "cursor-close",
                                                      "recover-clean"]
    assert (ack["records"], ack["acked"], ack["holes"], ack["ranges"]) == (10000, 10000, 10001, 10000)
    assert ack["ack_us"] > 0 and ack["state_bytes"] > 20001 // 8
    assert persist["snapshot_entries"] == 1 and 0 < persist["snapshot_bytes"] < persist["snapshot_payload_bytes"]
    assert kill["holes_recovered"] == clean["holes_recovered"] == 10001 and kill["entries_read"] == 1
    for r in (persist, kill, close, clean):
        assert r["records"] == 1 and r["elapsed_s"] > 0
    [target] = report["targets"]
    assert target["met"] is None and "10,001 holes of 20,001 entries" in target["value"]
    assert "rec/s" in done.stderr and "target 10,000,000 entries" in done.stderr
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"
