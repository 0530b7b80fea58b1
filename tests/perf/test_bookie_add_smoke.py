import re

import pytest

from bksim.adapters import processes
from perf.perf_smoke_checks import assert_figures


def test_bookie_add_reports_figures_and_ratio_and_stops_everything(run_perf):
    report = run_perf("bookie-add", "--record-bytes", "200", "--batch", "10", "--inflight", "2",
                      "--records", "500")
    base, bookie = report["results"]
    assert_figures(base, "grpc-baseline", 500, 200, 10)
    assert_figures(bookie, "bookie-add", 500, 200, 10)
    assert bookie["batches"] == 50 and "records_not_ok" not in bookie  # every add acknowledged OK
    assert bookie["bookie_stop_s"] >= 0  # stopped by SIGTERM within the grace time
    [q] = report["ratios"]
    assert (q["subject"], q["baseline"]) == ("bookie-add", "grpc-baseline") and q["ratio"] > 0
    # the bookie's memory, read from /proc: its peak (start-up included) at least what it held at either reading
    assert 0 < bookie["bookie_rss_serving_mb"] <= bookie["bookie_rss_peak_mb"]
    assert 0 < bookie["bookie_rss_end_mb"] <= bookie["bookie_rss_peak_mb"]
    [memory] = report["targets"]
    assert "bookie peak RSS <= write cache + 150 MB" in memory["target"]
    assert memory["met"] is (bookie["bookie_rss_peak_mb"] <= bookie["write_cache_mb"] + 150)
    assert f"peak {bookie['bookie_rss_peak_mb']:.0f} MB" in memory["value"]
    for pid in (base["server_pid"], bookie["server_pid"], bookie["zookeeper_pid"]):
        assert not processes.is_alive(pid)


def test_bookie_add_breakdown_adds_the_engine_alone_and_splits_the_bookies_cpu(run_perf):
    report = run_perf("bookie-add", "--record-bytes", "200", "--batch", "10", "--inflight", "2",
                      "--records", "500", "--breakdown")
    base, bookie, engine = report["results"]
    assert_figures(engine, "engine-add", 500, 200, 10)
    assert engine["checkpoints"] >= 1 and engine["journal_syncs"] >= 1  # the whole engine ran: close checkpoints
    assert 0 < engine["entry_encode_us"] and 0 <= engine["engine_cpu_us_per_entry"]
    memory, breakdown = report["targets"]
    assert breakdown["met"] is None and "bookie-add breakdown" in breakdown["target"]
    engine_us = engine["engine_cpu_us_per_entry"]
    echo_us = base["server_cpu_cores"] / base["records_per_s"] * 1e6
    assert f"engine {engine_us:.1f} us" in breakdown["value"]
    most = float(re.search(r"at most ([\d,]+) entries/s", breakdown["value"]).group(1).replace(",", ""))
    assert most == pytest.approx(1e6 / (engine_us + echo_us), rel=0.01)  # the report's figures are rounded
