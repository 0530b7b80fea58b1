"""Smoke tests of the metrics cost benchmarks: `bksim perf bookie-add --metrics` and `perf produce --metrics`
measure with metrics off and then on in one invocation and print the on/off throughput ratio against the 0.95
target. Tiny record-bounded runs: the report's structure, the scrapes done and every process stopped, never
the speed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from bksim.adapters import processes
from perf.perf_smoke_checks import assert_figures

pytestmark = pytest.mark.benchmark_run  # a long benchmark's smoke run: `make test-perf`, not `make test`

RUN_TIMEOUT_S = 240.0


def test_bookie_add_metrics_prints_both_results_and_the_ratio(tmp_path, repo_root):
    base = tmp_path / "perf"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "bookie-add", "--metrics", "--seconds", "0",
            "--records", "2000", "--record-bytes", "200", "--batch", "50", "--idle-min", "0", "--idle-wait-s", "0",
            "--dir", str(base)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n{out}\n{done.stderr}"
    assert "metrics off, then on (scraped every second)" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"^bookie-add(-metrics)?\s+200\s", line)]
    assert [r[0] for r in rows] == ["bookie-add", "bookie-add-metrics"] and all(r[3] == "2000" for r in rows), out
    assert "grpc-baseline" not in out
    assert re.search(r"^ratio bookie-add-metrics / bookie-add \(records/s\): [0-9.]+x \(target >= 0\.95x: "
                     r"(MET|BELOW TARGET)\)$", out, re.M), out
    assert re.search(r"^target bookie-add-metrics / bookie-add throughput >= 0\.95x \(metrics cost <= 5%\): .* "
                     r"= [0-9.]+x \([1-9][0-9]* scrapes every 1 s\): (MET|NOT MET|BELOW TARGET)", out, re.M), out
    assert re.search(r"bookie-add-metrics \[200 B x 50\]: .*scrapes=[1-9][0-9]*, .*scrape_errors=0", out), out
    assert list(base.iterdir()) == []


def test_produce_metrics_reports_the_pair_and_its_verdict(run_perf):
    report = run_perf("produce", "--metrics", "--records", "2000", "--batch", "100", "--max-pending", "500")
    off, on = report["results"]
    assert_figures(off, "produce", 2000, 100, 100)
    assert_figures(on, "produce-metrics", 2000, 100, 100)
    assert "scrapes" not in off and on["scrapes"] >= 4 and on["scrape_errors"] == 0  # 3 bookies + 1 broker
    [q] = report["ratios"]
    assert (q["subject"], q["baseline"], q["target"]) == ("produce-metrics", "produce", 0.95)
    assert abs(q["ratio"] - on["records_per_s"] / off["records_per_s"]) < 1e-3
    verdict = report["targets"][0]
    assert verdict["target"] == "produce-metrics / produce throughput >= 0.95x (metrics cost <= 5%)"
    assert verdict["met"] is (q["ratio"] >= 0.95)
    for r in (off, on):
        pids = [r["broker_pid"], r["zookeeper_pid"]] + [int(p) for p in r["bookie_pids"].split(",")]
        assert not any(processes.is_alive(pid) for pid in pids)
