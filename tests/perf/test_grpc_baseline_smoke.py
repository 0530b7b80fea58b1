from bksim.adapters import processes
from perf.perf_smoke_checks import assert_figures


def test_grpc_baseline_reports_figures_and_stops_its_server(run_perf):
    report = run_perf("grpc-baseline", "--record-bytes", "200", "--batch", "10", "--inflight", "2",
                      "--records", "500")
    [result] = report["results"]
    assert_figures(result, "grpc-baseline", 500, 200, 10)
    assert result["batches"] == 50 and result["server_cpu_cores"] > 0
    assert not processes.is_alive(result["server_pid"])
