from bksim.adapters import processes
from perf.perf_smoke_checks import assert_figures


def test_ledger_write_both_reports_figures_ratio_targets_and_stops_everything(run_perf):
    report = run_perf("ledger-write", "--entry-size", "200", "--batch", "10", "--window", "4",
                      "--records", "300", "--both")
    base, closed, opened = report["results"]
    assert_figures(base, "grpc-baseline", 300, 200, 10)
    assert_figures(closed, "ledger-write", 300, 200, 10)
    assert_figures(opened, "ledger-open-loop", 300, 200, 10)
    assert (closed["mode"], opened["mode"]) == ("closed-loop", "open-loop")
    assert closed["batches"] == opened["batches"] == 30
    assert (closed["ensemble"], closed["write_quorum"], closed["ack_quorum"]) == (3, 3, 2)
    assert closed["p50_ms"] <= closed["p95_ms"] <= closed["p99_ms"]
    # the open loop offers half the measured maximum
    assert abs(opened["rate_target_per_s"] - closed["records_per_s"] / 2) <= 1
    assert opened["entries_unsent_behind_schedule"] == 0  # bounded by records, not time: everything is sent
    for r in (closed, opened):
        assert r["broker_cpu_cores"] > 0 and r["bookies_cpu_cores"] > 0
        # None only where /proc/stat did not advance during the run (some sandboxes refresh it coarsely)
        assert r["machine_busy_cores"] is None or r["machine_busy_cores"] > 0
        assert r["ledger_id"] >= 0
    assert closed["ledger_id"] != opened["ledger_id"]  # a fresh ledger per measurement
    [q] = report["ratios"]
    assert (q["subject"], q["baseline"]) == ("ledger-write", "grpc-baseline") and q["ratio"] > 0
    assert q["target"] == 0.18 and q["met"] is (q["ratio"] >= 0.18)
    throughput, latency = report["targets"]
    assert throughput["met"] is None and "1 KiB" in throughput["value"]  # 200-byte entries: not the target's
    assert throughput["target"].startswith("ledger-write >= 0.18x grpc-baseline")
    assert throughput["value"].startswith(f"{q['ratio']:.2f}x")
    assert latency["met"] is None and latency["target"].startswith("ledger-open-loop p99 <= 15 ms at half")
    pids = [closed["broker_pid"], closed["zookeeper_pid"], base["server_pid"]]
    pids += [int(p) for p in closed["bookie_pids"].split(",")]
    assert len(pids) == 6
    for pid in pids:
        assert not processes.is_alive(pid)

