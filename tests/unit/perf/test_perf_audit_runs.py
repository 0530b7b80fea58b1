"""perf audit's runs and ratios (perf/audit.py): a local master is the one Spark run; a cluster master is measured
beside local[2], its ratio printed with the others but not judged as a target; medians per kind over repeats."""
from __future__ import annotations

from bksim.perf.audit import TARGET_LOCAL, TARGET_SPARK, ratios, spark_runs, targets
from bksim.perf.stats import LatencyRecorder, make_result

RECORDS = 1000


def result(name: str, seconds: float):
    latencies = LatencyRecorder()
    latencies.add(seconds, RECORDS)
    return make_result(name, 1024, 1, seconds, latencies, 1.0)


def run(cluster_s: float | None = None, spark_s: float = 4.0) -> list:
    out = [result("audit-bare-parse", 1.0), result("audit-local", 2.0), result("audit-spark", spark_s)]
    return out + ([result("audit-cluster", cluster_s)] if cluster_s is not None else [])


def test_a_local_master_is_the_one_spark_run_and_a_cluster_master_runs_beside_local2():
    assert spark_runs("local[2]") == [("audit-spark", "local[2]")]
    assert spark_runs("local[*]") == [("audit-spark", "local[*]")]
    assert spark_runs("spark://127.0.0.1:7077") == [("audit-spark", "local[2]"),
                                                    ("audit-cluster", "spark://127.0.0.1:7077")]


def test_the_cluster_rate_gets_its_ratio_but_the_targets_stay_spark_local2_and_local():
    got = ratios(run(cluster_s=8.0))
    assert [(q.subject, round(q.records_per_s_ratio, 3), q.target) for q in got] == [
        ("audit-spark", 0.25, TARGET_SPARK), ("audit-local", 0.5, TARGET_LOCAL), ("audit-cluster", 0.125, TARGET_SPARK)]
    assert [t["value"] for t in targets(got)] == ["0.25x", "0.50x"]
    assert [(q.subject, q.target) for q in ratios(run())] == [("audit-spark", TARGET_SPARK),
                                                             ("audit-local", TARGET_LOCAL)]


def test_repeated_runs_end_with_a_median_of_each_kind():
    got = ratios(run(cluster_s=8.0, spark_s=4.0) + run(cluster_s=2.0, spark_s=2.0) + run(cluster_s=4.0, spark_s=1.0))
    medians = [(q.subject, round(q.records_per_s_ratio, 3)) for q in got if "median" in q.subject]
    assert medians == [("audit-spark (median of 3)", 0.5), ("audit-local (median of 3)", 0.5),
                       ("audit-cluster (median of 3)", 0.25)]
    assert targets(got)[0]["value"] == "0.50x (audit-spark (median of 3))"
