"""LatencyHistogram: bounded buckets, weighted observations, cumulative form, merge, percentile."""
from __future__ import annotations

from bksim.model.histogram import BUCKETS_MS, LatencyHistogram


def test_observations_land_in_the_bucket_of_their_upper_bound():
    h = LatencyHistogram()
    h.observe(0.1)          # on a bound: that bucket (le is inclusive)
    h.observe(0.3, count=4)  # four operations of one batch
    h.observe(99_999.0)     # above the last bound
    h.observe(-1.0)         # a clock step: counted as 0
    cumulative = dict(h.cumulative())
    assert cumulative[0.1] == 2 and cumulative[0.25] == 2 and cumulative[0.5] == 6
    assert cumulative[BUCKETS_MS[-1]] == 6 and cumulative[float("inf")] == 7 == h.count
    assert h.sum_ms == 0.1 + 1.2 + 99_999.0
    assert len(h.buckets) == len(BUCKETS_MS) + 1  # the size never grows


def test_merge_and_percentile():
    a, b = LatencyHistogram(), LatencyHistogram()
    a.observe(1.0, 99)
    b.observe(40.0)
    a.merge(b)
    assert a.count == 100 and a.sum_ms == 99 + 40
    assert a.percentile_ms(50) == 1.0 and a.percentile_ms(100) == 50.0
    assert LatencyHistogram().percentile_ms(99) == 0.0
    a.observe(5.0, count=0)
    assert a.count == 100
