"""Smoke tests of `bksim perf soak` for a few seconds: the samples table, the chart and the bound verdict are there
and hang together (never a speed, nor whether the bound held in so short a run); interrupted while it samples, it
stops every child and removes its temp dir."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from bksim.adapters import processes

pytestmark = pytest.mark.benchmark_run  # a long benchmark's smoke run: `make test-perf`, not `make test`

RUN_TIMEOUT_S = 150.0
RATE = 200
SECONDS = 12


def test_soak_samples_every_bookie_and_draws_the_chart(tmp_path, repo_root):
    base, png = tmp_path / "perf", tmp_path / "chart" / "soak.png"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "soak", "--json", "--idle-min", "0", "--idle-wait-s", "0",
            "--dir", str(base), "--minutes", str(SECONDS / 60), "--rate", str(RATE), "--sample-s", "3",
            "--png", str(png)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads(done.stdout)
    assert report["benchmark"] == "soak"
    assert "# disk usage per bookie" in done.stderr and "rec/s" in done.stderr
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    [result] = report["results"]
    assert result["name"] == "soak" and result["records"] == result["received"] == result["sent"] == RATE * SECONDS
    [target] = report["targets"]
    assert isinstance(target["met"], bool) and "largest excess over live" in target["value"]
    samples = target["samples"]
    assert len(samples) >= SECONDS // 3 and [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)
    for s in samples:
        assert [b["name"] for b in s["bookies"]] == ["bookie-1", "bookie-2", "bookie-3"]
        for b in s["bookies"]:
            assert b["entrylog_bytes"] >= 0 and b["live_bytes"] >= 0 and b["index_bytes"] > 0
    # data reached the bookies' entry logs (a checkpoint a second): some sample saw bytes on some bookie
    assert max(b["entrylog_bytes"] for s in samples for b in s["bookies"]) > 0
    assert samples[-1]["received"] == RATE * SECONDS
    for pid in [result["broker_pid"], result["zookeeper_pid"], *map(int, result["bookie_pids"].split(","))]:
        assert not processes.is_alive(pid)


def test_a_soak_interrupted_while_it_samples_stops_everything(tmp_path, repo_root):
    base = tmp_path / "perf"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "soak", "--idle-min", "0", "--idle-wait-s", "0",
            "--dir", str(base), "--minutes", "2", "--rate", str(RATE), "--sample-s", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    proc = subprocess.Popen(argv, cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in proc.stdout:  # bounded by the test timeout; the second sample means producer and consumer run
            seen.append(line)
            if line.startswith("# t=") and sum(x.startswith("# t=") for x in seen) == 2:
                break
        children = [int(p) for path in glob.glob(f"/proc/{proc.pid}/task/*/children")
                    for p in open(path).read().split()]
        assert len(children) == 5, seen  # ZooKeeper, three bookies, the broker
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, "".join(seen) + rest
    assert "target entry-log bytes" not in rest  # no verdict from an interrupted run
    assert not [pid for pid in children if processes.is_alive(pid)]
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"
