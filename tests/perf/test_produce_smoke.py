"""Smoke tests of `bksim perf produce` and `bksim perf consume` (tiny record-bounded runs: the report's shape,
the checks the benchmarks make, every process stopped; never the speed)."""
from __future__ import annotations

from bksim.adapters import processes
from perf.perf_smoke_checks import assert_figures


def _stopped(result: dict) -> None:
    pids = [result["broker_pid"], result["zookeeper_pid"]] + [int(p) for p in result["bookie_pids"].split(",")]
    assert len(pids) == 5
    for pid in pids:
        assert not processes.is_alive(pid)


def test_produce_reports_figures_and_target_and_stops_everything(run_perf):
    report = run_perf("produce", "--records", "3000", "--batch", "100", "--max-pending", "500")
    [r] = report["results"]
    assert_figures(r, "produce", 3000, 100, 100)
    assert (r["ensemble"], r["write_quorum"], r["ack_quorum"], r["partitions"]) == (3, 3, 2, 0)
    assert 30 <= r["entries"] <= 3000 and 1 <= r["messages_per_entry"] <= 100  # batches of at most 100
    assert r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
    assert r["broker_cpu_cores"] > 0 and r["bookies_cpu_cores"] > 0 and r["client_cpu_cores"] > 0
    [t] = report["targets"]
    assert t["target"].startswith(">= 100,000 msgs/s (produce") and t["met"] in (True, False)
    _stopped(r)


def test_produce_partitioned(run_perf):
    report = run_perf("produce", "--records", "1000", "--partitions", "2", "--message-size", "50", "--batch", "100")
    [r] = report["results"]
    assert_figures(r, "produce", 1000, 50, 100)
    per_partition = [int(n) for n in r["entries_per_partition"].split(",")]
    assert r["partitions"] == 2 and sum(per_partition) == r["entries"] >= 10
    assert min(per_partition) >= 1  # round-robin per batch: both partitions got entries
    [t] = report["targets"]
    assert t["met"] is None and "target is for 100-byte messages" in t["value"]
    _stopped(r)


def test_consume_reports_the_backlog_produced_and_consumed_and_end_to_end(run_perf):
    report = run_perf("consume", "--records", "2000", "--batch", "100", "--rate", "4000", "--receiver-queue", "500")
    fill, drain, e2e = report["results"]
    assert_figures(fill, "produce-backlog", 2000, 100, 100)
    assert fill["latency"] == "send_async -> receipt" and fill["broker_cpu_cores"] > 0
    assert_figures(drain, "consume", 2000, 100, 100)
    assert_figures(e2e, "consume-e2e", 2000, 100, 100)
    assert drain["receiver_queue"] == 500 and drain["latency"] == "receive() call"
    assert e2e["rate_target_per_s"] == 4000 and e2e["latency"] == "due time -> received"
    assert e2e["p50_ms"] <= e2e["p95_ms"] <= e2e["p99_ms"]
    [q] = report["ratios"]  # the backlog consumed against the same backlog produced
    assert (q["subject"], q["baseline"], q["target"]) == ("consume", "produce-backlog", 1.2)
    assert abs(q["ratio"] - drain["records_per_s"] / fill["records_per_s"]) < 1e-3
    throughput, latency = report["targets"]
    assert throughput["target"].startswith(">= 100,000 msgs/s (consume")
    # offered 4,000 msgs/s: the e2e target (at 10,000) fails or is not established, never met
    assert latency["target"].startswith("consume-e2e p99 <= 25 ms at 10,000 msgs/s")
    assert latency["met"] is (False if e2e["p99_ms"] > 25 else None)
    _stopped(drain)
