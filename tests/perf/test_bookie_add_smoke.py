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
    for pid in (base["server_pid"], bookie["server_pid"], bookie["zookeeper_pid"]):
        assert not processes.is_alive(pid)
