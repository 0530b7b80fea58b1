"""Smoke tests of `bksim perf rereplication` at a tiny size (bounded by --size; not conftest's run_perf): workers
inside the bookies (the default) and in standalone processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import wait_until
from perf.perf_smoke_checks import assert_figures

pytestmark = pytest.mark.benchmark_run  # a long benchmark's smoke run: `make test-perf`, not `make test`

RUN_TIMEOUT_S = 240.0


def _run(base, repo_root, *extra: str) -> subprocess.CompletedProcess:
    """2 MB of data, 1 s phases, a writer at 200 entries/s, no idle wait; exit 0 required."""
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "rereplication", "--size", "2MB", "--seconds", "1",
            "--writer-rate", "200", *extra, "--json", "--idle-min", "0", "--idle-wait-s", "0", "--dir", str(base)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


def test_rereplication_reports_the_copy_and_the_writers_latencies_and_cleans_up(tmp_path, repo_root):
    base = tmp_path / "perf"
    done = _run(base, repo_root)
    report = json.loads(done.stdout)
    assert report["benchmark"] == "rereplication"
    by = {r["name"]: r for r in report["results"]}
    assert list(by) == ["ledger-write", "writer-without-rereplication", "writer-during-rereplication",
                        "rereplication"], list(by)
    assert by["ledger-write"]["records"] > 0 and by["ledger-write"]["records_per_s"] > 0
    copy = by["rereplication"]
    # 2 MB of 1 KiB entries in 4 ledgers, E=3 Qw=2: the lost bookie held 2/3 of the entries of each ledger naming it
    assert copy["ledgers"] == 4 and 1 <= copy["ledgers_naming_lost"] <= 4
    # only data ledgers are marked (ledger-write's is deleted before the loss): the copy is what is counted
    assert 1 <= copy["ledgers_marked_seen"] <= copy["ledgers_naming_lost"]
    assert copy["entries_copied"] == copy["records"] > 0 and copy["copy_entries_per_s"] > 0
    assert copy["workers"] == "in each of the 5 bookie processes (autorecovery.enabled)"
    assert copy["standalone_worker_pids"] == "" and copy["copy_workers_cpu_cores"] == 0
    assert 0 < copy["from_mark_s"] <= copy["from_kill_s"] and copy["mark_seen"] is True
    without = by["writer-without-rereplication"]
    assert 100 <= without["records"] <= 300  # 1 s at 200 entries/s, in batches of 10
    assert_figures(without, "writer-without-rereplication", without["records"], 1024, 10)
    assert by["writer-during-rereplication"]["records"] > 0
    assert [t["target"] for t in report["targets"]] == [
        "copy rate >= 0.5x ledger-write", "concurrent E=3 Qw=3 Qa=2 writer p99 <= 2x without re-replication"]
    assert all(t["met"] in (True, False) for t in report["targets"])
    assert "target copy rate >= 0.5x ledger-write" in done.stderr
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"


def test_rereplication_with_standalone_workers_copies_through_them_and_stops_them(tmp_path, repo_root):
    base = tmp_path / "perf"
    done = _run(base, repo_root, "--standalone-workers", "2", "--worker-nice", "5")
    copy = {r["name"]: r for r in json.loads(done.stdout)["results"]}["rereplication"]
    assert copy["workers"] == ("2 standalone `bksim autorecovery run` processes at nice 5; bookies without "
                               "autorecovery")
    assert copy["entries_copied"] == copy["records"] > 0 and copy["mark_seen"] is True
    assert copy["copy_workers_cpu_cores"] > 0  # the copy ran in them (the bookies run no worker)
    pids = [int(p) for p in copy["standalone_worker_pids"].split(",")]
    assert len(pids) == 2
    wait_until(lambda: not [p for p in pids if os.path.exists(f"/proc/{p}")], 5, message=f"workers {pids} stopped")
    assert "autorecovery: 2 standalone" in done.stderr
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"
