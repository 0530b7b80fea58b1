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
