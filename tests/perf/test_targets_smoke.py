"""Smoke tests of `bksim perf targets`: tiny runs that check the table (every selected row, with its verdict and
its command) and that each row states the verdict its benchmark states in the same report; never the speed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bksim.adapters import processes

RUN_TIMEOUT_S = 300.0
ROWS = ["bookie-add", "ledger-write", "ledger-write-p99", "consume-e2e", "consume-backlog", "replay", "bookie-rss"]


def _ratio(report: dict, subject: str, baseline: str) -> dict:
    [q] = [q for q in report["ratios"] if (q["subject"], q["baseline"]) == (subject, baseline)]
    return q


def _target(report: dict, prefix: str) -> dict:
    [t] = [t for t in report["targets"] if t["target"].startswith(prefix)]
    return t


@pytest.mark.benchmark_run  # every benchmark of the table one after the other (about a minute): `make test-perf`
def test_targets_measures_every_row_and_states_its_benchmarks_verdict(run_perf):
    report = run_perf("targets", "--seconds", "0.5", "--rss-seconds", "0.5", "--replay-size", "4MiB")
    rows = report["rows"]
    assert [r["row"] for r in rows] == ROWS
    for r in rows:  # each row established by its short run: a verdict either way, its value, the command
        assert r["verdict"] in ("MET", "NOT MET") and r["met"] is (r["verdict"] == "MET"), r
        assert r["value"] and r["target"] and "error" not in r
        assert r["command"].startswith("bksim perf ")
    by_row = {r["row"]: r for r in rows}
    for name in ("bookie-add", "bookie-rss"):
        assert "--batch 100 --record-bytes 1024 --seconds 0.5" in by_row[name]["command"]
    assert by_row["ledger-write-p99"]["command"].startswith("bksim perf ledger-write --both")
    assert by_row["consume-e2e"]["command"] == "bksim perf consume --seconds 0.5"
    assert by_row["replay"]["command"] == "bksim perf replay --size 4MiB"
    # the measurements ran one after the other, in the table's order, each benchmark's results in its own order
    assert [r["name"] for r in report["results"]] == [
        "grpc-baseline", "bookie-add", "grpc-baseline", "ledger-write", "ledger-open-loop", "produce-backlog",
        "consume", "consume-e2e", "journal-parse", "journal-replay", "replay-only", "bookie-add-rss"]
    # each row's verdict is the one its benchmark printed in the same report
    assert by_row["bookie-add"]["met"] is _ratio(report, "bookie-add", "grpc-baseline")["met"]
    assert _ratio(report, "bookie-add", "grpc-baseline")["target"] == 0.6
    assert by_row["ledger-write"]["met"] is _ratio(report, "ledger-write", "grpc-baseline")["met"]
    assert by_row["ledger-write"]["met"] is _target(report, "ledger-write >= 0.18x")["met"]
    assert by_row["ledger-write-p99"]["met"] is _target(report, "ledger-open-loop p99 <= 15 ms")["met"]
    assert by_row["consume-e2e"]["met"] is _target(report, "consume-e2e p99 <= 25 ms")["met"]
    assert by_row["consume-backlog"]["met"] is _ratio(report, "consume", "produce-backlog")["met"]
    assert by_row["replay"]["met"] is _ratio(report, "journal-replay", "journal-parse")["met"]
    assert by_row["bookie-rss"]["met"] is _target(report, "bookie-add-rss: bookie peak RSS")["met"]
    results = {r["name"]: r for r in report["results"]}
    open_loop, closed = results["ledger-open-loop"], results["ledger-write"]
    assert abs(open_loop["rate_target_per_s"] - closed["records_per_s"] / 2) <= 1  # half the closed-loop rate
    assert results["consume-e2e"]["rate_target_per_s"] == 10_000
    pids = [results["bookie-add"]["server_pid"], results["bookie-add-rss"]["server_pid"],
            closed["broker_pid"], results["consume"]["broker_pid"]]
    pids += [int(p) for r in (closed, results["consume"]) for p in r["bookie_pids"].split(",")]
    for pid in pids:
        assert not processes.is_alive(pid)


def test_rows_selects_the_rows_measured_and_printed(tmp_path, repo_root):
    base = tmp_path / "perf"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "targets", "--rows", "bookie-rss,replay",
            "--rss-seconds", "0.5", "--replay-size", "4MiB", "--idle-min", "0", "--idle-wait-s", "0",
            "--dir", str(base)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n{out}\n{done.stderr}"
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["row", "measured", "target", "verdict",
                                                                         "command"])
    table = lines[header + 1:header + 3]
    assert [line.split()[0] for line in table] == ["replay", "bookie-rss"]  # the table's order, not --rows'
    assert all(" MET " in line or " NOT MET " in line for line in table), table
    assert table[0].endswith("bksim perf replay --size 4MiB")
    assert table[1].endswith("bksim perf bookie-add --batch 100 --record-bytes 1024 --seconds 0.5")
    assert lines[header + 3].endswith("of 2 target(s) met")
    assert "2 row(s): replay, bookie-rss" in out
    assert "journal-parse" in out and "bookie-add-rss" in out
    assert "grpc-baseline" not in out and "ledger-write" not in out and "consume" not in out  # nothing else ran
    assert list(base.iterdir()) == []
