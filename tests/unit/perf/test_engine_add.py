"""perf/engine_add.py: the breakdown line's arithmetic (the measurement itself: tests/perf/test_bookie_add_smoke.py)."""
from __future__ import annotations

from bksim.perf.engine_add import ceiling
from bksim.perf.stats import Result


def result(name: str, records_per_s: float, **extra) -> Result:
    return Result(name=name, record_bytes=1024, group=100, records=int(records_per_s), elapsed_s=1.0, p50_ms=1.0,
                  p99_ms=2.0, p999_ms=3.0, max_ms=4.0, mean_ms=1.0, cpu_idle_before=1.0, extra=extra)


def test_the_bookies_cpu_per_entry_splits_into_the_engines_and_the_rest_and_bounds_one_core():
    base = result("grpc-baseline", 400_000, server_cpu_cores=0.8)  # 2 us per entry
    bookie = result("bookie-add", 125_000, server_cpu_cores=1.0)   # 8 us per entry
    engine = result("engine-add", 200_000, engine_cpu_us_per_entry=3.0)
    line = ceiling(base, bookie, engine)
    assert line["met"] is None
    assert "bookie 8.0 us = engine 3.0 us (engine-add) + 5.0 us gRPC and service" in line["value"]
    assert "echo server: 2.0 us" in line["value"]
    assert "at most 200,000 entries/s = 0.50x grpc-baseline" in line["value"]  # 1 / (3 + 2) us
