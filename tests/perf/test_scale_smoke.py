"""Smoke tests of `bksim perf scale` with tiny points: each axis prints its table and its verdict line, draws a valid
PNG, reports the same in its JSON, and leaves nothing behind (never a speed, nor a verdict's outcome); interrupted
while it adds topics, it stops every child and removes its temp dir. The verdict rule and the points' parsing are
checked without a cluster."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from bksim.adapters import processes
from bksim.perf import scale

RUN_TIMEOUT_S = 240.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_scale(tmp_path, repo_root, axis: str, points: str, seconds: str = "1") -> tuple[dict, str]:
    base, charts = tmp_path / "perf", tmp_path / "charts"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "scale", "--json", "--axis", axis, "--points", points,
            "--seconds", seconds, "--idle-min", "0", "--idle-wait-s", "0", "--dir", str(base), "--png-dir", str(charts)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads(done.stdout)
    assert report["benchmark"] == "scale"
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"
    png = charts / f"scale-{axis}.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000
    [target] = report["targets"]
    assert target["axis"] == axis and target["png"] == str(png)
    assert target["met"] in (True, False, None)
    rows = [r for r in target["points"] if not r.get("baseline")]
    assert [r["points"] for r in rows] == scale.parse_points(axis, points)
    assert target["verdicts"] and all(v["verdict"] in ("roughly flat", "grows", "falls", "n/a")
                                      for v in target["verdicts"])
    err = done.stderr
    assert f"# scale {axis}: " in err
    verdict_lines = [line for line in err.splitlines() if line.startswith(f"verdict {axis}: ")]
    assert len(verdict_lines) == 1
    for v in target["verdicts"]:
        assert v["cost"] in verdict_lines[0]
    assert f"# chart: {png}" in err
    assert "rec/s" in err  # the common table follows
    return target, err


def table_rows(err: str, axis: str) -> list[list[str]]:
    """The rows of the axis's table: the lines between its header (the line after its title) and its first note."""
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines[:-1])
                 if line.startswith(f"# scale {axis}: ") and not lines[i + 1].startswith("#"))
    rows = []
    for line in lines[start + 2:]:
        if line.startswith("#") or line.startswith("verdict"):
            break
        rows.append(line.split())
    return rows


@pytest.mark.benchmark_run
def test_scale_topics_reports_per_topic_costs_and_a_chart(tmp_path, repo_root):
    target, err = run_scale(tmp_path, repo_root, "topics", "1,3")
    rows = table_rows(err, "topics")
    assert [r[0] for r in rows] == ["0", "1", "3"]  # the baseline, then every point
    base, *points = target["points"]
    assert base["baseline"] and base["znodes"] > 0
    for row, n, added in zip(points, (1, 3), (1, 2)):
        assert row["created"] == added and row["clients"] == 1
        assert row["znodes"] > base["znodes"] and row["znodes_per_topic"] > 0  # every topic has znodes of its own
        assert 0 < row["lookup_p50_ms"] <= row["lookup_p99_ms"] and 0 < row["first_quiet_p99_ms"]
        assert row["lookup_quiet_p99_ms"] > 0 and row["broker_still_cores"] >= 0
        assert row["first_quiet_subscribed_p50_ms"] > 0  # the last topic of a point is added with the load paused
        assert n == 1 or (row["first_p50_ms"] > 0 and row["first_producer_p50_ms"] > 0)  # the one before: under load
        assert row["sent"] == row["received"] or abs(row["sent"] - row["received"]) <= n
    assert {v["key"] for v in target["verdicts"]} == {"broker_mcores_per_topic", "still_mcores_per_topic",
                                                       "rss_kib_per_topic",
                                                       "znodes_per_topic", "lookup_p99_ms", "lookup_quiet_p99_ms",
                                                       "first_p99_ms", "first_quiet_p99_ms"}


@pytest.mark.benchmark_run
def test_scale_subscriptions_reports_cpu_per_delivered_message(tmp_path, repo_root):
    target, err = run_scale(tmp_path, repo_root, "subscriptions", "1,2")
    assert [r[0] for r in table_rows(err, "subscriptions")] == ["0", "1", "2"]
    _, one, two = target["points"]
    assert one["received"] > 0 and two["received"] > one["received"]  # two subscriptions: twice the deliveries
    assert one["us_per_delivered"] > 0 and one["e2e_p50_ms"] > 0


@pytest.mark.benchmark_run
def test_scale_ledgers_reports_index_rss_and_restart_per_ledger(tmp_path, repo_root):
    target, err = run_scale(tmp_path, repo_root, "ledgers", "10,20")
    assert [r[0] for r in table_rows(err, "ledgers")] == ["0", "10", "20"]
    base, ten, twenty = target["points"]
    assert base["restart_s"] > 0 and base["index_mb"] > 0
    for row in (ten, twenty):
        assert row["adds_per_s"] > 0 and row["index_mb"] >= base["index_mb"] and row["rss_restarted_mb"] > 0
        assert row["stop_s"] > 0 and row["start_s"] > 0 and row["restart_s"] == pytest.approx(
            row["stop_s"] + row["start_s"])
    assert [v["key"] for v in target["verdicts"]] == ["index_b_per_ledger", "rss_b_per_ledger",
                                                      "restart_us_per_ledger"]


@pytest.mark.benchmark_run
def test_scale_entry_size_reports_ratios_to_both_limits(tmp_path, repo_root):
    target, err = run_scale(tmp_path, repo_root, "entry-size", "100,1K", seconds="0.5")
    assert [r[0] for r in table_rows(err, "entry-size")] == ["100", "1,024"]
    for row, size in zip(target["points"], (100, 1024)):
        assert row["points"] == size and row["batch"] == scale_storage_batch(size)
        for key in ("fsync_mb_s", "grpc_mb_s", "bookie_mb_s", "vs_fsync", "vs_grpc"):
            assert row[key] > 0
        assert row["vs_grpc"] * row["grpc_over_bookie"] == pytest.approx(1.0)


def scale_storage_batch(size: int) -> int:
    from bksim.perf import scale_storage

    return scale_storage.batch_for(size)


@pytest.mark.benchmark_run
def test_scale_interrupted_while_adding_topics_stops_everything(tmp_path, repo_root):
    base = tmp_path / "perf"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "scale", "--axis", "topics", "--points", "1,400",
            "--seconds", "1", "--idle-min", "0", "--idle-wait-s", "0", "--dir", str(base),
            "--png-dir", str(tmp_path / "charts")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    proc = subprocess.Popen(argv, cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in proc.stdout:  # bounded by the test timeout; after the first point, the second one adds topics
            seen.append(line)
            if line.startswith("# scale topics: 1 topics"):
                break
        children = [int(p) for path in glob.glob(f"/proc/{proc.pid}/task/*/children")
                    for p in open(path).read().split()]
        assert len(children) == 4, seen  # ZooKeeper, two bookies, the broker
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, "".join(seen) + rest
    assert "verdict topics" not in rest
    assert not [pid for pid in children if processes.is_alive(pid)]
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"


def test_verdict_is_flat_within_twice_the_smallest_points_cost():
    assert scale.verdict(10.0, 19.9) == ("roughly flat", pytest.approx(1.99))
    assert scale.verdict(10.0, 5.0) == ("roughly flat", pytest.approx(0.5))
    assert scale.verdict(10.0, 31.0)[0] == "grows" and scale.verdict(10.0, 31.0)[1] == pytest.approx(3.1)
    assert scale.verdict(10.0, 4.0)[0] == "falls"
    assert scale.verdict(0.0, 4.0) == ("n/a", None) and scale.verdict(None, 4.0) == ("n/a", None)


def test_judge_starts_at_the_smallest_resolved_point():
    report = scale.AxisReport("topics", "topics", "test", [], [scale.Cost("c", "cost")])
    for n, value, ok in ((1, 50.0, False), (10, 2.0, True), (100, 5.0, True)):
        row = {"points": n}
        scale.resolved(row, "c", value, ok)
        report.rows.append(row)
    judged = scale.judge(report)
    [v] = judged["verdicts"]
    assert (v["verdict"], v["span"]) == ("grows", "10 -> 100") and v["factor"] == pytest.approx(2.5)
    assert judged["met"] is False
    assert "# (value): below what the measurement resolves" in "\n".join(scale.table(report))
    assert scale.verdict_line(report, judged).startswith("verdict topics: GROWS (cost x2.5)")


def test_points_are_parsed_per_axis():
    assert scale.parse_points("topics", "1,10,1_000") == [1, 10, 1000]
    assert scale.parse_points("entry-size", "100,1K,10k,1M") == [100, 1024, 10240, 1048576]
    for axis, text in (("topics", "10,1"), ("topics", "0,1"), ("ledgers", "1.5"), ("entry-size", "1Q"),
                       ("subscriptions", "")):
        with pytest.raises(ValueError):
            scale.parse_points(axis, text)


def test_bad_options_are_refused_before_anything_starts(tmp_path, repo_root):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    for extra in (["--points", "1,10"], ["--axis", "entry-size", "--points", "10"],
                  ["--axis", "topics", "--seconds", "0"]):
        done = subprocess.run([sys.executable, "-m", "bksim.cli.main", "perf", "scale", "--dir", str(tmp_path / "p"),
                               *extra], capture_output=True, text=True, timeout=60, cwd=repo_root, env=env)
        assert done.returncode != 0 and "error" in done.stderr.lower(), (extra, done.stderr)
        assert not (tmp_path / "p").exists() or list((tmp_path / "p").iterdir()) == []
