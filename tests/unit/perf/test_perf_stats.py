"""bksim.perf.stats (percentiles per record, throughput, ratios, the report) and machine's /proc parsing."""
from __future__ import annotations

import os

import pytest

from bksim.perf import machine
from bksim.perf.stats import LatencyRecorder, format_table, make_result, median_ratio, ratio


def test_percentiles_are_nearest_rank_over_records():
    rec = LatencyRecorder()
    for i in range(1, 101):  # 1..100 ms, one record each
        rec.add(i / 1000.0)
    assert rec.records == 100
    assert rec.percentile_s(50) == pytest.approx(0.050)
    assert rec.percentile_s(99) == pytest.approx(0.099)
    assert rec.percentile_s(99.9) == pytest.approx(0.100)
    assert rec.percentile_s(100) == pytest.approx(0.100)
    assert rec.max_s() == pytest.approx(0.100)
    assert rec.mean_s() == pytest.approx(0.0505)


def test_a_sample_counts_once_per_record_it_acknowledged():
    rec = LatencyRecorder()
    rec.add(0.001, records=99)  # one fsync group of 99 records
    rec.add(0.500, records=1)
    assert rec.records == 100
    assert rec.percentile_s(50) == pytest.approx(0.001)
    assert rec.percentile_s(99) == pytest.approx(0.001)
    assert rec.percentile_s(99.9) == pytest.approx(0.500)
    assert rec.mean_s() == pytest.approx((0.099 + 0.5) / 100)


def test_samples_may_arrive_in_any_order():
    rec = LatencyRecorder()
    for v in (0.3, 0.1, 0.2):
        rec.add(v, records=10)
    assert rec.percentile_s(34) == pytest.approx(0.2)
    assert rec.percentile_s(33) == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [lambda r: r.percentile_s(50), lambda r: r.max_s(), lambda r: r.mean_s()])
def test_empty_recorder_refuses(bad):
    with pytest.raises(ValueError, match="no latency samples"):
        bad(LatencyRecorder())


def test_invalid_samples_and_percentiles_are_refused():
    rec = LatencyRecorder()
    with pytest.raises(ValueError):
        rec.add(0.1, records=0)
    with pytest.raises(ValueError):
        rec.add(-0.1)
    rec.add(0.1)
    for q in (0, -1, 100.1):
        with pytest.raises(ValueError):
            rec.percentile_s(q)


def _result(name: str, records: int, elapsed_s: float, record_bytes: int = 1000, group: int = 10):
    rec = LatencyRecorder()
    rec.add(0.002, records)
    return make_result(name, record_bytes, group, elapsed_s, rec, 0.97, {"syncs": 3})


def test_result_throughput_and_json():
    r = _result("fsync-baseline", records=2000, elapsed_s=0.5)
    assert r.records_per_s == pytest.approx(4000)
    assert r.mb_per_s == pytest.approx(4.0)  # MB = 10**6 bytes
    assert r.p50_ms == r.p99_ms == r.p999_ms == pytest.approx(2.0)
    j = r.to_json()
    assert j["records"] == 2000 and j["records_per_s"] == pytest.approx(4000) and j["syncs"] == 3
    assert j["cpu_idle_before"] == pytest.approx(0.97)


def test_make_result_refuses_an_empty_run():
    with pytest.raises(ValueError, match="no record was acknowledged"):
        make_result("x", 1024, 1, 1.0, LatencyRecorder(), 1.0)


def test_ratio_against_target_and_only_for_like_runs():
    base = _result("grpc-baseline", records=1000, elapsed_s=1.0)
    fast = _result("bookie-add", records=600, elapsed_s=1.0)
    slow = _result("bookie-add", records=400, elapsed_s=1.0)
    assert ratio(fast, base, 0.5).records_per_s_ratio == pytest.approx(0.6)
    assert ratio(fast, base, 0.5).met and not ratio(slow, base, 0.5).met
    assert ratio(slow, base, 0.5).to_json() == {"subject": "bookie-add", "baseline": "grpc-baseline",
                                                "ratio": 0.4, "target": 0.5, "met": False}
    other_group = _result("bookie-add", records=600, elapsed_s=1.0, group=20)
    with pytest.raises(ValueError, match="unlike runs"):
        ratio(other_group, base, 0.5)


def test_table_has_a_row_per_result_and_a_ratio_line():
    base = _result("grpc-baseline", records=1000, elapsed_s=1.0)
    subject = _result("bookie-add", records=400, elapsed_s=1.0)
    text = format_table([base, subject], [ratio(subject, base, 0.5)], header=["# machine: test"])
    lines = text.splitlines()
    assert lines[0] == "# machine: test"
    assert "p99.9 ms" in lines[1]
    assert lines[2].startswith("grpc-baseline") and "1,000" in lines[2]
    assert lines[3].startswith("bookie-add") and "400" in lines[3]
    assert "0.40x" in text and "BELOW TARGET" in text


def test_idle_fraction_counts_idle_and_iowait():
    before = machine.CpuTimes(idle=100, total=1000)
    after = machine.CpuTimes(idle=190, total=1100)
    assert machine.idle_fraction(before, after) == pytest.approx(0.9)
    assert machine.idle_fraction(after, after) is None  # /proc/stat did not advance: not measured


def test_proc_readers_work_on_this_machine():
    t = machine.read_cpu_times()
    assert t.total > 0 and 0 <= t.idle <= t.total
    sum(range(200_000))  # burn a little CPU so our own counter is not 0 on a fresh process
    assert machine.process_cpu_s(os.getpid()) > 0
    facts = machine.facts(".")
    assert facts["cores"] >= 1 and facts["python"].count(".") == 2 and facts["dir_fs"] != ""


def test_median_of_repeated_ratios():
    base = _result("fsync-baseline", records=1000, elapsed_s=1.0)
    qs = [ratio(_result("journal-append", records=n, elapsed_s=1.0), base, 0.5) for n in (300, 700, 600)]
    m = median_ratio(qs)
    assert m.records_per_s_ratio == pytest.approx(0.6) and m.met
    assert m.subject == "journal-append (median of 3)"
    assert median_ratio(qs[:2]).records_per_s_ratio == pytest.approx(0.5)
    with pytest.raises(ValueError):
        median_ratio([])
