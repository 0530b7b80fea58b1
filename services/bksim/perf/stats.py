"""Benchmark results: per-record latency percentiles, throughput, ratios, and their table/JSON rendering.

Pure (no clock, no I/O): the benchmarks measure, this module only counts and formats.

Latency is recorded per *group* of records that share one acknowledgement (an fsync group, a gRPC batch,
an append_many call): `LatencyRecorder.add(latency_s, records)` counts the latency once per record, so the
percentiles are per record, as the benchmark definitions ask. Percentiles use the nearest-rank method: p99
is the smallest latency at or below which at least 99 % of the records fall.

Units: MB = 10**6 bytes (as in the environment notes' tables); latencies are printed in milliseconds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MB = 1_000_000
PERCENTILES = (50.0, 99.0, 99.9)


class LatencyRecorder:
    """Latency samples, each weighted by the number of records it acknowledged."""

    def __init__(self) -> None:
        self._latencies_s: list[float] = []
        self._records: list[int] = []
        self.records = 0

    def add(self, latency_s: float, records: int = 1) -> None:
        if records <= 0:
            raise ValueError(f"a latency sample must cover at least 1 record, got {records}")
        if latency_s < 0:
            raise ValueError(f"negative latency {latency_s!r}")
        self._latencies_s.append(latency_s)
        self._records.append(records)
        self.records += records

    def percentile_s(self, q: float) -> float:
        """Nearest-rank percentile (0 < q <= 100) over records; raises ValueError when empty."""
        if not 0 < q <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {q}")
        if not self.records:
            raise ValueError("no latency samples recorded")
        rank = max(1, math.ceil(q / 100.0 * self.records))
        seen = 0
        for latency_s, records in sorted(zip(self._latencies_s, self._records)):
            seen += records
            if seen >= rank:
                return latency_s
        raise AssertionError("rank beyond the record count")  # unreachable: rank <= self.records

    def max_s(self) -> float:
        if not self.records:
            raise ValueError("no latency samples recorded")
        return max(self._latencies_s)

    def mean_s(self) -> float:
        if not self.records:
            raise ValueError("no latency samples recorded")
        return sum(l * n for l, n in zip(self._latencies_s, self._records)) / self.records


@dataclass(frozen=True, slots=True)
class Result:
    """One measurement: `records` acknowledged records of `record_bytes` each in `elapsed_s` seconds."""

    name: str  # benchmark name, e.g. "fsync-baseline"
    record_bytes: int
    group: int  # records per fsync (fsync, journal) or per gRPC message (grpc, bookie)
    records: int
    elapsed_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mean_ms: float
    cpu_idle_before: float  # idle fraction of the machine just before the measurement
    extra: dict = field(default_factory=dict)  # benchmark-specific figures (syncs, cpu cores used, ...)

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.records * self.record_bytes / self.elapsed_s / MB if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict:
        return {
            "name": self.name, "record_bytes": self.record_bytes, "group": self.group,
            "records": self.records, "elapsed_s": round(self.elapsed_s, 6),
            "records_per_s": round(self.records_per_s, 1), "mb_per_s": round(self.mb_per_s, 3),
            "p50_ms": round(self.p50_ms, 4), "p99_ms": round(self.p99_ms, 4), "p999_ms": round(self.p999_ms, 4),
            "max_ms": round(self.max_ms, 4), "mean_ms": round(self.mean_ms, 4),
            "cpu_idle_before": round(self.cpu_idle_before, 3),
            **{k: round(v, 4) if isinstance(v, float) else v for k, v in self.extra.items()},
        }


def make_result(name: str, record_bytes: int, group: int, elapsed_s: float, latencies: LatencyRecorder,
                cpu_idle_before: float, extra: dict | None = None) -> Result:
    """Build a Result from a recorder; raises ValueError if nothing was acknowledged."""
    if not latencies.records:
        raise ValueError(f"{name}: no record was acknowledged; nothing to report")
    p50, p99, p999 = (latencies.percentile_s(q) * 1000.0 for q in PERCENTILES)
    return Result(name=name, record_bytes=record_bytes, group=group, records=latencies.records,
                  elapsed_s=elapsed_s, p50_ms=p50, p99_ms=p99, p999_ms=p999, max_ms=latencies.max_s() * 1000.0,
                  mean_ms=latencies.mean_s() * 1000.0, cpu_idle_before=cpu_idle_before, extra=dict(extra or {}))


@dataclass(frozen=True, slots=True)
class Ratio:
    """`subject` throughput over `baseline` throughput, measured in the same run, against a target."""

    subject: str
    baseline: str
    records_per_s_ratio: float
    target: float

    @property
    def met(self) -> bool:
        return self.records_per_s_ratio >= self.target

    def to_json(self) -> dict:
        return {"subject": self.subject, "baseline": self.baseline,
                "ratio": round(self.records_per_s_ratio, 4), "target": self.target, "met": self.met}


def ratio(subject: Result, baseline: Result, target: float) -> Ratio:
    if (subject.record_bytes, subject.group) != (baseline.record_bytes, baseline.group):
        raise ValueError(f"ratio of unlike runs: {subject.name} has record/group "
                         f"{subject.record_bytes}/{subject.group}, {baseline.name} "
                         f"{baseline.record_bytes}/{baseline.group}")
    value = subject.records_per_s / baseline.records_per_s if baseline.records_per_s > 0 else 0.0
    return Ratio(subject.name, baseline.name, value, target)


def median_ratio(ratios: list[Ratio]) -> Ratio:
    """The median of repeated like ratios (same subject, baseline and target), named "... (median of N)"."""
    if not ratios:
        raise ValueError("no ratios to take the median of")
    first = ratios[0]
    if any((q.subject, q.baseline, q.target) != (first.subject, first.baseline, first.target) for q in ratios):
        raise ValueError("median of unlike ratios")
    values = sorted(q.records_per_s_ratio for q in ratios)
    mid = len(values) // 2
    value = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return Ratio(f"{first.subject} (median of {len(values)})", first.baseline, value, first.target)


COLUMNS = (("benchmark", "<", 16), ("rec B", ">", 7), ("group", ">", 6), ("records", ">", 9),
           ("s", ">", 6), ("rec/s", ">", 10), ("MB/s", ">", 8), ("p50 ms", ">", 8), ("p99 ms", ">", 8),
           ("p99.9 ms", ">", 9), ("max ms", ">", 8), ("idle", ">", 5))


def format_table(results: list[Result], ratios: list[Ratio] = (), header: list[str] = ()) -> str:
    """The human report: header lines, one row per result, then one line per ratio."""
    lines = list(header)
    lines.append("  ".join(f"{title:{align}{width}}" for title, align, width in COLUMNS))
    for r in results:
        cells = (r.name, r.record_bytes, r.group, r.records, f"{r.elapsed_s:.2f}", f"{r.records_per_s:,.0f}",
                 f"{r.mb_per_s:.1f}", f"{r.p50_ms:.3f}", f"{r.p99_ms:.3f}", f"{r.p999_ms:.3f}", f"{r.max_ms:.3f}",
                 f"{r.cpu_idle_before:.2f}")
        lines.append("  ".join(f"{str(c):{align}{width}}" for c, (_, align, width) in zip(cells, COLUMNS)))
    for r in results:
        if r.extra:
            lines.append(f"  {r.name} [{r.record_bytes} B x {r.group}]: "
                         + ", ".join(f"{k}={_fmt(v)}" for k, v in r.extra.items()))
    for q in ratios:
        verdict = "MET" if q.met else "BELOW TARGET"
        lines.append(f"ratio {q.subject} / {q.baseline} (records/s): {q.records_per_s_ratio:.2f}x "
                     f"(target >= {q.target:.2f}x: {verdict})")
    return "\n".join(lines)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "n/a" if v is None else str(v)
