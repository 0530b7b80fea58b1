"""A bounded latency histogram the pure layers record into and an adapter exports (adapters/metrics.py).

Fixed bucket upper bounds in milliseconds (BUCKETS_MS, BookKeeper's OpStats are in milliseconds too), one
counter per bucket plus one for everything above the last bound, the count and the sum: its size never grows
with the number of observations. Recording is one bisect and three additions (no clock read: the caller
passes the duration it measured through its Clock port), so it stays on the hot paths (a journal group, an
add batch) at all times; exporting reads a consistent-enough snapshot between two event-loop steps.

`observe(ms, count)` records `count` operations that each took `ms` (an add batch of n entries answered
together is n adds of that latency).
"""
from __future__ import annotations

from bisect import bisect_left

# upper bounds (ms, inclusive) from 0.1 ms (a sync on a write-back cache) to 10 s (a stalled device)
BUCKETS_MS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
                                 1_000.0, 2_500.0, 5_000.0, 10_000.0)
assert list(BUCKETS_MS) == sorted(set(BUCKETS_MS)) and BUCKETS_MS[0] > 0


class LatencyHistogram:
    """Counts of observations per bucket of BUCKETS_MS (the last counter: above the last bound)."""

    __slots__ = ("buckets", "count", "sum_ms")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS_MS) + 1)
        self.count = 0
        self.sum_ms = 0.0

    def observe(self, ms: float, count: int = 1) -> None:
        if count <= 0:
            return
        if ms < 0:
            ms = 0.0  # maybe: a clock step seen by the caller; never a negative latency
        self.buckets[bisect_left(BUCKETS_MS, ms)] += count
        self.count += count
        self.sum_ms += ms * count

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound ms, observations <= it) per bucket, ending with (inf, count): Prometheus's `le` form."""
        out, running = [], 0
        for bound, n in zip(BUCKETS_MS + (float("inf"),), self.buckets):
            running += n
            out.append((bound, running))
        return out

    def merge(self, other: "LatencyHistogram") -> None:
        for i, n in enumerate(other.buckets):
            self.buckets[i] += n
        self.count += other.count
        self.sum_ms += other.sum_ms

    def percentile_ms(self, q: float) -> float:
        """The upper bound of the bucket holding the q-th percentile (0 < q <= 100); 0.0 when empty."""
        if not self.count:
            return 0.0
        rank = q / 100.0 * self.count
        for bound, running in self.cumulative():
            if running >= rank:
                return bound
        return float("inf")
