"""Smoke tests of `bksim perf recovery` (bounded by --entries; it has no --seconds, so not conftest's run_perf)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bksim.adapters import processes
from perf.perf_smoke_checks import assert_figures

RUN_TIMEOUT_S = 240.0


@pytest.fixture
def run_recovery(tmp_path, repo_root):
    def run(*args: str) -> dict:
        base = tmp_path / "perf"
        argv = [sys.executable, "-m", "bksim.cli.main", "perf", "recovery", "--json", "--idle-min", "0",
                "--idle-wait-s", "0", "--dir", str(base), *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
        assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        report = json.loads(done.stdout)
        assert report["benchmark"] == "recovery"
        assert "rec/s" in done.stderr and "target recovery of a 10,000-entry window" in done.stderr
        assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"
        return report
    return run


def test_recovery_reports_the_time_and_its_split_and_stops_everything(run_recovery):
    report = run_recovery("--entries", "300", "--lac", "19", "--entry-size", "256", "--batch", "50",
                          "--ensemble", "3", "--write-quorum", "2", "--ack-quorum", "2")
    reference, window = report["results"]
    assert_figures(reference, "recovery-reference", 1, 256, 1)
    assert_figures(window, "recovery", 280, 256, 1)
    # the dying writer's LAC stayed at 19: recovery read forward from there and wrote back the 280 above it
    assert (window["recovered_lac"], window["written_back"], window["window_entries"]) == (19, 280, 280)
    assert window["last_entry_id"] == 299 and abs(window["p50_ms"] - window["recovery_s"] * 1000) < 0.1
    assert (window["ensemble"], window["write_quorum"], window["ack_quorum"]) == (3, 2, 2)
    # the reference's writer kept its LAC up: one entry to write back
    assert (reference["recovered_lac"], reference["written_back"], reference["last_entry_id"]) == (298, 1, 299)
    assert 0 < window["broker_span_s"] <= window["recovery_s"]
    assert abs(window["fixed_s"] - reference["recovery_s"]) < 1e-3
    parts = [window[k] for k in ("before_write_back_s", "write_back_s", "after_write_back_s")]
    assert all(p >= 0 for p in parts) and abs(sum(parts) - window["recovery_s"]) < 1e-3
    assert window["write_back_s"] > 0
    [target] = report["targets"]
    assert target["met"] is None and "280-entry window" in target["value"]  # not the 10,000 of the target
    for pid in (window["broker_pid"], window["zookeeper_pid"]):
        assert not processes.is_alive(pid)
