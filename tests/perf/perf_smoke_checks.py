"""Checks shared by the perf smoke tests: the figures are there and positive (never a speed)."""
from __future__ import annotations


def assert_figures(result: dict, name: str, records: int, record_bytes: int, group: int) -> None:
    assert result["name"] == name
    assert result["records"] == records
    assert (result["record_bytes"], result["group"]) == (record_bytes, group)
    for key in ("elapsed_s", "records_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "max_ms"):
        assert result[key] > 0, f"{name}: {key} = {result[key]}"
    assert result["p50_ms"] <= result["p99_ms"] <= result["p999_ms"] <= result["max_ms"]
    assert 0 <= result["cpu_idle_before"] <= 1
