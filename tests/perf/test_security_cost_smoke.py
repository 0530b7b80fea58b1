"""Smoke tests of the security cost benchmarks: `bksim perf ledger-write --tls` and `perf produce --tls --auth`
measure a plain and a secured cluster in one invocation and print the secured/plain ratio and p99 difference
against the targets. Tiny record-bounded runs: the report's structure and every process stopped, never the speed.
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


def _stopped(result: dict) -> None:
    pids = [result["broker_pid"], result["zookeeper_pid"]] + [int(p) for p in result["bookie_pids"].split(",")]
    for pid in pids:
        assert not processes.is_alive(pid)


def test_ledger_write_tls_prints_both_results_and_the_ratio_line(tmp_path, repo_root):
    base = tmp_path / "perf"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "ledger-write", "--tls", "--seconds", "0",
            "--records", "300", "--entry-size", "200", "--batch", "10", "--window", "4", "--idle-min", "0",
            "--idle-wait-s", "0", "--dir", str(base)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n{out}\n{done.stderr}"
    assert "plain, then TLS on every gRPC link" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"^ledger-write(-tls)?\s+200\s", line)]
    assert [r[0] for r in rows] == ["ledger-write", "ledger-write-tls"] and all(r[3] == "300" for r in rows), out
    assert "grpc-baseline" not in out
    assert re.search(r"^ratio ledger-write-tls / ledger-write \(records/s\): [0-9.]+x \(target >= 0\.70x: "
                     r"(MET|BELOW TARGET)\)$", out, re.M), out
    assert re.search(r"^target ledger-write-tls p99 <= ledger-write p99 \+ 2 ms: p99 [0-9.]+ ms vs [0-9.]+ ms = "
                     r"[+-][0-9.]+ ms .*: NOT ESTABLISHED$", out, re.M), out  # closed loop: not judged
    assert list(base.iterdir()) == []  # the clusters, certificates and keys are gone


def test_produce_tls_auth_reports_the_pair_and_its_verdicts(run_perf):
    report = run_perf("produce", "--tls", "--auth", "--records", "2000", "--batch", "100", "--max-pending", "500")
    plain, secured = report["results"]
    assert_figures(plain, "produce", 2000, 100, 100)
    assert_figures(secured, "produce-tls-auth", 2000, 100, 100)
    assert plain["broker_pid"] != secured["broker_pid"]  # two clusters, one after the other
    [q] = report["ratios"]
    assert (q["subject"], q["baseline"], q["target"]) == ("produce-tls-auth", "produce", 0.7)
    assert abs(q["ratio"] - secured["records_per_s"] / plain["records_per_s"]) < 1e-3
    throughput, p99 = report["targets"][:2]
    assert throughput["target"] == "produce-tls-auth / produce throughput >= 0.70x"
    assert throughput["met"] is (q["ratio"] >= 0.7)
    assert p99["target"] == "produce-tls-auth p99 <= produce p99 + 2 ms" and p99["met"] is None
    assert f"{secured['p99_ms'] - plain['p99_ms']:+.2f} ms" in p99["value"]
    assert [t["target"] for t in report["targets"][2:]] == [">= 100,000 msgs/s (produce, 100-byte messages)"]
    for r in (plain, secured):
        _stopped(r)
