from bksim.adapters import processes
from perf.perf_smoke_checks import assert_figures


def test_grpc_baseline_reports_figures_and_stops_its_server(run_perf):
    # 1,000 batches: enough server work to span several of /proc's 10 ms CPU ticks (50 batches used ~5 ms and
    # sometimes measured 0 ticks)
    report = run_perf("grpc-baseline", "--record-bytes", "200", "--batch", "10", "--inflight", "4",
                      "--records", "10000")
    [result] = report["results"]
    assert_figures(result, "grpc-baseline", 10000, 200, 10)
    assert result["batches"] == 1000 and result["server_cpu_cores"] > 0
    assert not processes.is_alive(result["server_pid"])
