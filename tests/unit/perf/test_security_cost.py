"""perf/security_cost.py: the secured/plain ratio and the p99 verdict (judged only on a comparable open-loop pair)."""
from __future__ import annotations

from bksim.perf.security_cost import compare
from bksim.perf.stats import LatencyRecorder, make_result


def result(name: str, records: int, elapsed_s: float, p99_ms: float, **extra):
    lat = LatencyRecorder()
    lat.add(p99_ms / 1000.0, records)
    return make_result(name, 1024, 100, elapsed_s, lat, 1.0, extra)


def test_the_ratio_and_throughput_verdict():
    q, (throughput, _) = compare(result("w", 1000, 1.0, 5.0), result("w-tls", 690, 1.0, 5.0))
    assert round(q.records_per_s_ratio, 2) == 0.69 and not q.met and throughput["met"] is False
    q, (throughput, _) = compare(result("w", 1000, 1.0, 5.0), result("w-tls", 700, 1.0, 5.0))
    assert q.met and throughput["met"] is True and "700/s vs 1,000/s = 0.70x" in throughput["value"]


def test_p99_is_judged_on_an_open_loop_pair_at_one_rate_only():
    open_loop = dict(mode="open-loop", rate_target_per_s=500.0, entries_unsent_behind_schedule=0)
    plain = result("o", 500, 1.0, 10.0, **open_loop)
    _, (_, p99) = compare(plain, result("o-tls", 500, 1.0, 12.0, **open_loop))
    assert p99["met"] is True and "+2.00 ms" in p99["value"]
    _, (_, p99) = compare(plain, result("o-tls", 500, 1.0, 12.5, **open_loop))
    assert p99["met"] is False
    _, (_, p99) = compare(plain, result("o-tls", 500, 1.0, 11.0, **dict(open_loop, rate_target_per_s=400.0)))
    assert p99["met"] is None  # another offered rate
    _, (_, p99) = compare(plain, result("o-tls", 500, 1.0, 11.0, **dict(open_loop, entries_unsent_behind_schedule=9)))
    assert p99["met"] is None and "not comparable" in p99["value"]
    _, (_, p99) = compare(result("w", 500, 1.0, 10.0, mode="closed-loop"), result("w-tls", 500, 1.0, 11.0))
    assert p99["met"] is None and "closed loop" in p99["value"]
